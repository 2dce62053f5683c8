//! The last finished CNI calls, kept in memory for `weftctl calls`: what an operator
//! looks at first when a pod is stuck.

use std::collections::VecDeque;
use std::sync::Mutex;

/// One finished CNI call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallRecord {
    /// When it finished (Unix milliseconds).
    pub finished_unix_ms: i64,
    /// `ADD`, `DEL`, `CHECK`, `STATUS`, `GC`.
    pub command: String,
    /// Pod namespace from `CNI_ARGS`.
    pub pod_namespace: String,
    /// Pod name from `CNI_ARGS`.
    pub pod_name: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// How long the call took.
    pub duration_ms: f64,
    /// CNI code, 0 for success.
    pub cni_code: u32,
    /// gRPC status code name.
    pub grpc_code: String,
    /// The trace the call belongs to.
    pub trace_id: String,
    /// The error's message and details, empty on success.
    pub error: String,
}

/// A bounded ring of the last finished calls.
#[derive(Debug)]
pub struct CallLog {
    capacity: usize,
    calls: Mutex<VecDeque<CallRecord>>,
}

impl CallLog {
    /// Keeps the last `capacity` calls.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            calls: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
        }
    }

    /// Adds a finished call, forgetting the oldest when full.
    pub fn push(&self, c: CallRecord) {
        if self.capacity == 0 {
            return;
        }
        let mut q = self.calls.lock().expect("call log lock");
        if q.len() == self.capacity {
            q.pop_front();
        }
        q.push_back(c);
    }

    /// The calls kept, oldest first, filtered by failure and pod name.
    pub fn list(&self, failed_only: bool, pod: Option<&str>) -> Vec<CallRecord> {
        self.calls
            .lock()
            .expect("call log lock")
            .iter()
            .filter(|c| !failed_only || c.cni_code != 0)
            .filter(|c| pod.is_none_or(|p| c.pod_name == p))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_n_and_filters() {
        let log = CallLog::new(3);
        for i in 0..5 {
            log.push(CallRecord {
                pod_name: format!("p{i}"),
                cni_code: i % 2,
                ..Default::default()
            });
        }
        let all = log.list(false, None);
        assert_eq!(
            all.iter().map(|c| c.pod_name.as_str()).collect::<Vec<_>>(),
            ["p2", "p3", "p4"]
        );
        assert_eq!(log.list(true, None).len(), 1);
        assert_eq!(log.list(false, Some("p4")).len(), 1);
        assert!(log.list(false, Some("p0")).is_empty());
    }
}
