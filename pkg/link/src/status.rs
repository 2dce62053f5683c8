//! Where each link of a pod stands, as its Topology's status reports it and as a pod
//! that waits for its links (`waitForLinks`) sees it.

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The state of one link of a pod, seen from the pod's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LinkPhase {
    /// Not carrying frames yet, for a reason that should clear (the peer pod is not
    /// running anywhere, its node has not built its end, a VNI is being agreed).
    #[default]
    Pending,
    /// Both ends built and up.
    Up,
    /// Built, and taken down by an operator (`weftctl link down`).
    Down,
    /// Could not be built here (the kernel or the data plane refused); retried.
    Failed,
}

impl LinkPhase {
    /// The lowercase name used in the status and in `weftctl` tables.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkPhase::Pending => "pending",
            LinkPhase::Up => "up",
            LinkPhase::Down => "down",
            LinkPhase::Failed => "failed",
        }
    }

    /// Whether the link is as ready as it will get without an operator: built, and up
    /// unless an operator took it down. A pod waiting for its links starts then.
    pub fn settled(self) -> bool {
        matches!(self, LinkPhase::Up | LinkPhase::Down)
    }
}

impl fmt::Display for LinkPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One link of a pod and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LinkStatus {
    /// The link's uid.
    pub uid: i64,
    /// The pod's interface of the link.
    pub local_intf: String,
    /// The pod at the other end.
    pub peer_pod: String,
    /// Its interface.
    pub peer_intf: String,
    /// Where the link stands.
    pub state: LinkPhase,
    /// Why it is pending, down or failed (empty when up).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl fmt::Display for LinkStatus {
    /// `e1 (to r2:e1): pending: the peer pod …`, as a CNI error's details list it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (to {}:{}): {}",
            self.local_intf, self.peer_pod, self.peer_intf, self.state
        )?;
        if !self.reason.is_empty() {
            write!(f, ": {}", self.reason)?;
        }
        Ok(())
    }
}

/// The longest a pod's ADD may wait for its links: a runtime gives up on a sandbox
/// after a few minutes (kubelet's default request timeout is 2 minutes), and a wait
/// beyond that would only hold its addresses.
pub const MAX_LINK_WAIT: Duration = Duration::from_secs(300);

/// Reads a wait for links (`waitForLinks` in a network config, `wait_for_links` in a
/// Topology): a duration such as `30s`, `500ms` or `2m`; zero means not to wait.
pub fn parse_link_wait(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration such as \"30s\" or \"500ms\": {e}"))?;
    if d > MAX_LINK_WAIT {
        return Err(format!(
            "{s:?} is longer than a runtime waits for a pod; at most {}",
            humantime::format_duration(MAX_LINK_WAIT)
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_built_links_are_settled_and_the_reason_is_shown() {
        assert!(LinkPhase::Up.settled() && LinkPhase::Down.settled());
        assert!(!LinkPhase::Pending.settled() && !LinkPhase::Failed.settled());
        let s = LinkStatus {
            uid: 1,
            local_intf: "e1".into(),
            peer_pod: "r2".into(),
            peer_intf: "e3".into(),
            state: LinkPhase::Pending,
            reason: "the peer pod runs nowhere yet".into(),
        };
        assert_eq!(s.to_string(), "e1 (to r2:e3): pending: the peer pod runs nowhere yet");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["state"], "pending");
        let up = LinkStatus {
            state: LinkPhase::Up,
            reason: String::new(),
            ..s
        };
        assert!(serde_json::to_value(&up).unwrap().get("reason").is_none());
    }

    #[test]
    fn waits_are_durations_within_the_bound() {
        assert_eq!(parse_link_wait("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_link_wait("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_link_wait("0s"), Ok(Duration::ZERO));
        assert!(parse_link_wait("30").unwrap_err().contains("not a duration"));
        assert!(parse_link_wait("10m").unwrap_err().contains("at most 5m"));
    }
}
