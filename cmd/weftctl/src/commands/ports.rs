//! `weftctl ports`: the host ports held on the node.

use std::path::Path;

use serde::Serialize;
use weft_rpc::admin::PortsRequest;
use weft_rpc::admin::admin_client::AdminClient;

#[derive(Serialize)]
struct Port {
    host_ip: String,
    host_port: u32,
    protocol: String,
    container_ip: String,
    container_port: u32,
    pod_namespace: String,
    pod: String,
    container_id: String,
}

/// Prints the host ports.
pub async fn run(socket: &Path, json: bool) -> anyhow::Result<()> {
    let mut client = AdminClient::new(super::connect(socket).await?);
    let ports: Vec<Port> = client
        .ports(PortsRequest {})
        .await?
        .into_inner()
        .ports
        .into_iter()
        .map(|p| Port {
            host_ip: p.host_ip,
            host_port: p.host_port,
            protocol: p.protocol,
            container_ip: p.container_ip,
            container_port: p.container_port,
            pod_namespace: p.pod_namespace,
            pod: p.pod_name,
            container_id: p.container_id,
        })
        .collect();
    if json {
        outln!("{}", serde_json::to_string_pretty(&ports)?);
        return Ok(());
    }
    outln!("{:<32} {:<5} {:<32} POD", "HOST", "PROTO", "POD ADDRESS");
    for p in &ports {
        let six = p.container_ip.contains(':');
        let host = match (p.host_ip.is_empty(), six) {
            (true, false) => format!("0.0.0.0:{}", p.host_port),
            (true, true) => format!("[::]:{}", p.host_port),
            (false, false) => format!("{}:{}", p.host_ip, p.host_port),
            (false, true) => format!("[{}]:{}", p.host_ip, p.host_port),
        };
        let target = if six {
            format!("[{}]:{}", p.container_ip, p.container_port)
        } else {
            format!("{}:{}", p.container_ip, p.container_port)
        };
        let pod = super::pod_label(&p.pod_namespace, &p.pod, &p.container_id);
        outln!("{host:<32} {:<5} {target:<32} {pod}", p.protocol);
    }
    Ok(())
}
