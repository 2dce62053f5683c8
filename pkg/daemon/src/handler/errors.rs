//! How a failure of the store or the kernel becomes the CNI error a caller gets.

use weft_cni::{CniError, Code};
use weft_kernel::KernelError;
use weft_kernel::ptp::{self};
use weft_store::StoreError;

pub(super) fn store_err(e: StoreError) -> CniError {
    match e {
        StoreError::Exhausted { .. } => CniError::new(Code::RangeExhausted, e.to_string()),
        StoreError::PortTaken { .. } => CniError::new(Code::HostPortInUse, e.to_string()),
        StoreError::PortInvalid(_) => CniError::new(Code::InvalidConfig, e.to_string()),
        StoreError::AddressTaken { .. } => CniError::new(Code::AddressInUse, e.to_string()),
        StoreError::AddressInvalid(_) => CniError::new(Code::InvalidConfig, e.to_string()),
        StoreError::Closed => CniError::new(Code::TryAgainLater, "weftd is shutting down"),
        StoreError::Panicked(_) => CniError::new(Code::Internal, e.to_string()),
        // A full disk (or a read-only, failing or damaged file) is the node's condition,
        // not the call's: the runtime retries, and the node answers not ready until the
        // store writes again.
        StoreError::Sqlite(cause) if e.cannot_write() => CniError::new(
            Code::TryAgainLater,
            format!("{STORE_CANNOT_WRITE}: {cause}; weftd takes pods again once it can write (see /readyz)"),
        ),
        other => CniError::new(Code::Store, other.to_string()),
    }
}

/// How the details of a CNI error start when the state store cannot be written.
pub const STORE_CANNOT_WRITE: &str = "the state store cannot be written";

pub(super) fn kernel_err(e: KernelError) -> CniError {
    if ptp::is_route_conflict(&e)
        && let KernelError::Os { step, .. } = &e
    {
        return CniError::new(
            Code::RouteExists,
            format!(
                "{step}: the pod has a route to that destination already (another network of the pod, or its \
                 runtime, installed it); leave it out of `routes`, leave `defaultRoute` unset, and give each \
                 network of a pod its own ranges"
            ),
        );
    }
    match e {
        KernelError::InvalidNetns { .. } => CniError::new(Code::InvalidNetns, e.to_string()),
        KernelError::InterfaceExists { .. } => CniError::new(Code::InterfaceExists, e.to_string()),
        KernelError::Drift(d) => CniError::new(Code::CheckFailed, d.to_string()),
        KernelError::Os { .. } => CniError::new(Code::Kernel, e.to_string()),
    }
}
