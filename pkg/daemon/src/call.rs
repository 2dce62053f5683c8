//! What a CNI call hands the handler, in the daemon's own terms: the gRPC surface
//! (`service.rs`) converts the plugin's protobuf request into this in one place, so the
//! handler and its tests never see the wire format.

use std::collections::HashMap;

/// One CNI call's arguments, as the runtime gave them to the plugin (the command is the
/// handler method called).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniCall {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`: path of the pod's network namespace (may be empty on DEL).
    pub netns: String,
    /// `CNI_IFNAME`: the interface to create inside the pod.
    pub ifname: String,
    /// `CNI_ARGS` as key/value pairs (`K8S_POD_NAME`, `IP`, `MAC`, ...).
    pub args: HashMap<String, String>,
    /// The network configuration exactly as the plugin read it from stdin.
    pub config: Vec<u8>,
}
