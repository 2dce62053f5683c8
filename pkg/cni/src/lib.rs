//! CNI types for weft: the network configuration weft reads, `CNI_ARGS`, input
//! validation, the error codes weft answers with, and the conversion of results
//! between CNI spec versions. Shared by the plugin (which must stay lean) and the
//! daemon, so both sides judge input the same way. Also the DEL spool both share
//! ([`spool`]): DELs the plugin could not hand to a down weftd.
//!
//! The spec's own data structures come from `rscni-types`; this crate adds weft's
//! configuration keys and the rules around them.

pub mod args;
pub mod conf;
pub mod error;
pub mod request;
pub mod result;
pub mod spool;
pub mod validate;
pub mod version;

pub use args::parse_cni_args;
pub use conf::{HostIp, NetworkConfig, PluginConfig, PortMappingConf, RouteConf};
pub use error::{Class, CniError, Code};
pub use rscni_types::types::{CNIResult, Cmd, Dns, GcAttachment, Interface, IpConfig, Route};
pub use version::SpecVersion;
