//! The node daemon's service: the CNI calls relayed by the plugin are handled here,
//! over narrow seams, [`Ipam`] (node state and address allocation), [`PodNetworking`]
//! (the kernel) and [`Wiring`] (the pod's links), so the handler can be tested on its
//! own; the admin service reads node state through [`AdminState`].
//!
//! Data flows one way: [`service`] (the whole gRPC surface, in one file) decodes a
//! call into a [`CniCall`] and hands it to [`handler::Handler`], which consults the
//! store and drives the kernel. [`server`] serves it on the UNIX socket; [`recover`]
//! finishes what a crash interrupted before anything is served; [`spool`] replays the
//! DELs the plugin recorded while weftd was down.

pub mod call;
pub mod capture;
pub mod changes;
pub mod defaults;
pub mod gateways;
pub mod handler;
pub mod locks;
pub mod naming;
pub mod rebuild;
pub mod recover;
pub mod seams;
pub mod server;
pub mod service;
pub mod spool;

pub use call::CniCall;
pub use defaults::PodDefaults;
pub use handler::{Handler, NodeInfo};
pub use seams::{
    AdminState, FrameStream, Ipam, KernelNetworking, LinkError, LinkRef, POLICED_IFNAME, PodNetworking, PolicedPod,
    PolicyHook, StateSummary, TableSync, WiredPod, Wiring,
};
pub use spool::{DelSpool, Replayed};
