//! `weftctl policy`: why a connection is allowed or denied (`explain`), the flows
//! network policy denied (`denies`) and the addresses learnt for domain names
//! (`names`), asked of the daemon at `--socket` or, with `--lab FILE`, of a lab's
//! daemons (any node explains the whole cluster; each node reports the flows it denied
//! and what it learnt).

use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde::Serialize;
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{PolicyDeniesRequest, PolicyDeny, PolicyExplainRequest, PolicySide};

/// What `weftctl policy` does.
#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Whether a new connection from SRC to DST on PORT/PROTO is allowed, which
    /// policies isolate each side, and the rule that allows it or that none does. Pods
    /// as NAMESPACE/NAME (NAME: namespace default), or addresses. Any node's daemon
    /// answers for the whole cluster.
    Explain {
        /// The source.
        src: String,
        /// The destination.
        dst: String,
        /// The destination port and protocol, as 80/tcp (tcp when left out).
        port: String,
        /// Ask a lab's daemon (`weftctl lab`) instead of the one at `--socket`.
        #[arg(long)]
        lab: Option<PathBuf>,
    },
    /// The flows this node's policies denied (and, in audit mode, would have), newest
    /// last: source, destination, port, direction and the policies that isolate.
    Denies {
        /// Keep going and print new ones as they come.
        #[arg(long, short)]
        follow: bool,
        /// How many of the recent ones (0: all the daemon keeps).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Ask every node of a lab (`weftctl lab`) instead of the daemon at `--socket`
        /// (with --follow: the first node only).
        #[arg(long)]
        lab: Option<PathBuf>,
    },
    /// The addresses each node learnt from DNS answers for ClusterNetworkPolicy
    /// `domainNames` rules: name, address, and how long it stays allowed for new
    /// connections.
    Names {
        /// Ask every node of a lab (`weftctl lab`) instead of the daemon at `--socket`.
        #[arg(long)]
        lab: Option<PathBuf>,
    },
}

#[derive(Serialize)]
struct Side {
    policed: bool,
    isolating: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<u32>,
    audit: bool,
    /// The ClusterNetworkPolicy rule that decided, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<serde_json::Value>,
}

fn side(s: Option<PolicySide>) -> Side {
    let s = s.unwrap_or_default();
    let allowed = !s.allowed_by.is_empty();
    let cluster = (!s.cluster_policy.is_empty()).then(|| {
        serde_json::json!({
            "policy": s.cluster_policy, "tier": s.cluster_tier, "rule": s.cluster_rule,
            "rule_name": s.cluster_rule_name, "action": s.cluster_action,
            "domains": s.cluster_domains,
        })
    });
    Side {
        policed: s.policed,
        isolating: s.isolating,
        rule: allowed.then_some(s.rule),
        allowed_by: allowed.then_some(s.allowed_by),
        audit: s.audit,
        cluster,
    }
}

/// `80/tcp`, `53/udp`, `80` (tcp).
fn port_spec(s: &str) -> anyhow::Result<(u32, String)> {
    let (port, proto) = s.split_once('/').unwrap_or((s, "tcp"));
    let port: u32 = port.parse().map_err(|_| anyhow::anyhow!("{s:?}: a port as 80/tcp"))?;
    Ok((port, proto.to_ascii_lowercase()))
}

fn describe(what: &str, s: &Side) -> String {
    if !s.policed {
        return format!("{what}: not policed (an address, a host-network pod, or its own node)");
    }
    if let Some(c) = &s.cluster {
        let name = c["rule_name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let domains: Vec<&str> = c["domains"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_str())
            .collect();
        let by_name = if domains.is_empty() {
            String::new()
        } else {
            format!(", as the answer for {} gave the address", domains.join(", "))
        };
        return format!(
            "{what}: {} by ClusterNetworkPolicy {} ({} tier) rule {}{name}{by_name}",
            if c["action"] == "Accept" { "accepted" } else { "DENIED" },
            c["policy"].as_str().unwrap_or_default(),
            c["tier"].as_str().unwrap_or_default(),
            c["rule"],
        );
    }
    if s.isolating.is_empty() {
        return format!("{what}: not isolated (no policy selects the pod this way): allowed");
    }
    let by = match (&s.allowed_by, s.rule) {
        (Some(p), Some(r)) => format!("allowed by {p} rule {r}"),
        _ if s.audit => "no rule allows it: would be denied (audit mode: forwarded)".to_string(),
        _ => "no rule of them allows it: DENIED".to_string(),
    };
    format!("{what}: isolated by {}; {by}", s.isolating.join(", "))
}

fn print_deny(d: &PolicyDeny) {
    let when = super::clock(d.at_unix_ms);
    let port = if d.port == 0 {
        d.protocol.clone()
    } else {
        format!("{}/{}", d.port, d.protocol)
    };
    outln!(
        "{when}  {:<6} {:<7} {} -> {} {port}  isolated by {}",
        if d.audit { "audit" } else { "deny" },
        d.direction,
        d.src,
        d.dst,
        d.policies.join(", ")
    );
}

/// Runs a policy action against the daemon at `socket`.
pub async fn run(action: PolicyAction, socket: &Path, json: bool) -> anyhow::Result<()> {
    match action {
        PolicyAction::Explain { src, dst, port, lab } => {
            let socket = super::daemons(socket, lab.as_deref())?.remove(0);
            let mut client = AdminClient::new(super::connect(&socket).await?);
            let (port, protocol) = port_spec(&port)?;
            let r = client
                .policy_explain(PolicyExplainRequest {
                    src,
                    dst,
                    protocol: protocol.clone(),
                    port,
                })
                .await
                .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                .into_inner();
            let (egress, ingress) = (side(r.egress), side(r.ingress));
            if json {
                let v = serde_json::json!({
                    "src": r.src, "dst": r.dst, "src_ip": r.src_ip, "dst_ip": r.dst_ip,
                    "port": port, "protocol": protocol,
                    "allowed": r.allowed, "passes": r.passes,
                    "egress": egress, "ingress": ingress, "problems": r.problems,
                });
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            outln!(
                "{} ({}) -> {} ({}) {port}/{protocol}: {}",
                r.src,
                r.src_ip,
                r.dst,
                r.dst_ip,
                match (r.allowed, r.passes) {
                    (true, _) => "ALLOWED",
                    (false, true) => "DENIED in audit mode (forwarded)",
                    (false, false) => "DENIED",
                }
            );
            outln!("  {}", describe(&format!("egress of {}", r.src), &egress));
            outln!("  {}", describe(&format!("ingress of {}", r.dst), &ingress));
            if !r.problems.is_empty() {
                outln!("  not read in full (weft fails closed where it cannot read):");
                for p in &r.problems {
                    outln!("    {p}");
                }
            }
            Ok(())
        }
        PolicyAction::Names { lab } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            for socket in super::daemons(socket, lab.as_deref())? {
                let mut client = AdminClient::new(super::connect(&socket).await?);
                let r = client
                    .policy_names(weft_rpc::admin::PolicyNamesRequest {})
                    .await
                    .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                    .into_inner();
                for a in &r.addresses {
                    let left = (a.expires_unix_ms - now).max(0) / 1000;
                    if json {
                        let v = serde_json::json!({"node": r.node, "name": a.name, "address": a.address,
                            "expires_unix_ms": a.expires_unix_ms, "ttl_left_s": left});
                        outln!("{}", serde_json::to_string(&v)?);
                    } else {
                        outln!("{:<10} {:<40} {:<39} {left}s", r.node, a.name, a.address);
                    }
                }
                if !json && r.addresses.is_empty() {
                    outln!("{:<10} (nothing learnt)", r.node);
                }
            }
            Ok(())
        }
        PolicyAction::Denies { follow, limit, lab } => {
            let all = super::daemons(socket, lab.as_deref())?;
            let asked = if follow { &all[..1] } else { &all[..] };
            let mut denies = Vec::new();
            for socket in asked {
                let mut client = AdminClient::new(super::connect(socket).await?);
                let mut stream = client
                    .policy_denies(PolicyDeniesRequest { limit, follow })
                    .await
                    .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                    .into_inner();
                if follow {
                    while let Some(d) = stream.message().await? {
                        show_deny(&d, json);
                    }
                    return Ok(());
                }
                while let Some(d) = stream.message().await? {
                    denies.push(d);
                }
            }
            denies.sort_by_key(|d| d.at_unix_ms);
            for d in &denies {
                show_deny(d, json);
            }
            Ok(())
        }
    }
}

/// One denied flow, as a line of text or of JSON.
fn show_deny(d: &PolicyDeny, json: bool) {
    if !json {
        print_deny(d);
        return;
    }
    let v = serde_json::json!({
        "at_unix_ms": d.at_unix_ms, "action": if d.audit { "audit" } else { "deny" },
        "direction": d.direction, "src": d.src, "dst": d.dst, "src_ip": d.src_ip,
        "dst_ip": d.dst_ip, "protocol": d.protocol, "port": d.port, "policies": d.policies,
    });
    outln!("{v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_sides_read_as_people_write_them() {
        assert_eq!(port_spec("80/TCP").unwrap(), (80, "tcp".to_string()));
        assert_eq!(port_spec("53").unwrap(), (53, "tcp".to_string()));
        assert!(port_spec("http/tcp").is_err());
        let denied = Side {
            policed: true,
            isolating: vec!["x/deny".into()],
            allowed_by: None,
            rule: None,
            audit: false,
            cluster: None,
        };
        assert!(describe("ingress of x/a", &denied).ends_with("DENIED"));
        assert_eq!(super::super::clock(3_723_004), "01:02:03.004");
    }
}
