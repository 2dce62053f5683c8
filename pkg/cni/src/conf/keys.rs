//! weft's own keys of the network configuration, as typed serde shapes. Each key is
//! read as [`Given`]: of the type it should be, or whatever else was there, kept so the
//! error can show it. Nothing here fails to decode; what is wrong is judged, with
//! weft's messages, where the key is used (`super`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// A value as given: of the expected type, or anything else (named in the error).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum Given<T> {
    /// Of the expected type.
    Typed(T),
    /// Anything else.
    Other(Value),
}

/// weft's keys at the top of the network configuration (the spec's are in
/// `rscni_types::NetConf`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WeftKeys {
    /// `socket`: the daemon socket's absolute path.
    #[serde(default)]
    pub(super) socket: Option<Given<String>>,
    /// `ranges`: CIDR strings.
    #[serde(default)]
    pub(super) ranges: Option<Given<Vec<Given<String>>>>,
    /// `mtu`.
    #[serde(default)]
    pub(super) mtu: Option<Given<u64>>,
    /// `routes`: entries read one by one as [`RouteKeys`] (the entry is named in
    /// errors).
    #[serde(default)]
    pub(super) routes: Option<Given<Vec<Value>>>,
    /// `defaultRoute`.
    #[serde(default)]
    pub(super) default_route: Option<Given<bool>>,
    /// `waitForLinks`: a duration string.
    #[serde(default)]
    pub(super) wait_for_links: Option<Given<String>>,
    /// `runtimeConfig`: the capabilities weft reads there.
    #[serde(default)]
    pub(super) runtime_config: Option<Given<RuntimeKeys>>,
    /// `runtimeConfig.portMappings`, taken out of the config before the spec's types
    /// read it (they know only one spelling); entries read one by one as
    /// [`PortMappingKeys`].
    #[serde(skip)]
    pub(super) port_mappings: Option<Given<Vec<Value>>>,
}

/// The capability arguments weft reads from `runtimeConfig` (`portMappings` is taken
/// out before the spec's types see the config, see `super::decode_split`).
#[derive(Debug, Default, Deserialize)]
pub(super) struct RuntimeKeys {
    /// `ips`: addresses, with or without a prefix.
    #[serde(default)]
    pub(super) ips: Option<Given<Vec<Given<String>>>>,
    /// `mac`.
    #[serde(default)]
    pub(super) mac: Option<Given<String>>,
}

/// One entry of `routes`. Keys other than `dst` and `gw` land in `other` and are
/// refused.
#[derive(Debug, Deserialize)]
pub(super) struct RouteKeys {
    /// The destination CIDR.
    #[serde(default)]
    pub(super) dst: Option<Given<String>>,
    /// The next hop.
    #[serde(default)]
    pub(super) gw: Option<Given<String>>,
    /// Any other key (sorted, so the first is named).
    #[serde(flatten)]
    pub(super) other: BTreeMap<String, Value>,
}

/// One entry of `runtimeConfig.portMappings`, in either spelling runtimes use
/// (containerd 1.6 sends Go's field names); the camelCase one wins when both are there.
#[derive(Debug, Deserialize)]
pub(super) struct PortMappingKeys {
    #[serde(default, rename = "hostPort")]
    host_port: Option<Given<u64>>,
    #[serde(default, rename = "HostPort")]
    host_port_go: Option<Given<u64>>,
    #[serde(default, rename = "containerPort")]
    container_port: Option<Given<u64>>,
    #[serde(default, rename = "ContainerPort")]
    container_port_go: Option<Given<u64>>,
    #[serde(default)]
    protocol: Option<Given<String>>,
    #[serde(default, rename = "Protocol")]
    protocol_go: Option<Given<String>>,
    #[serde(default, rename = "hostIP")]
    host_ip: Option<Given<String>>,
    #[serde(default, rename = "HostIP")]
    host_ip_go: Option<Given<String>>,
    #[serde(default, rename = "hostIp")]
    host_ip_lower: Option<Given<String>>,
}

impl PortMappingKeys {
    /// `hostPort`, in whichever spelling was given.
    pub(super) fn host_port(&self) -> Option<&Given<u64>> {
        self.host_port.as_ref().or(self.host_port_go.as_ref())
    }

    /// `containerPort`, in whichever spelling was given.
    pub(super) fn container_port(&self) -> Option<&Given<u64>> {
        self.container_port.as_ref().or(self.container_port_go.as_ref())
    }

    /// `protocol`, in whichever spelling was given.
    pub(super) fn protocol(&self) -> Option<&Given<String>> {
        self.protocol.as_ref().or(self.protocol_go.as_ref())
    }

    /// `hostIP`, in whichever spelling was given.
    pub(super) fn host_ip(&self) -> Option<&Given<String>> {
        self.host_ip
            .as_ref()
            .or(self.host_ip_go.as_ref())
            .or(self.host_ip_lower.as_ref())
    }
}
