//! The server side of `Ends`: what a peer node tells this one about the ends of links
//! whose other end is here. VNI offers are held in the store (refused when the VNI is
//! taken here) and removals set the end down; the pass that follows does the kernel
//! work.

use tracing::debug;
use weft_link::{LinkKind, WireState};
use weft_rpc::wire::{End, EndResult, EndsReply, EndsRequest, Hello};
use weft_store::StoreError;

use super::Engine;
use super::plan;
use crate::convert;
use crate::plane::GrpcPlane;

fn accept() -> EndResult {
    EndResult {
        accepted: true,
        reason: String::new(),
    }
}

fn refuse(reason: String) -> EndResult {
    EndResult {
        accepted: false,
        reason,
    }
}

impl<P: GrpcPlane> Engine<P> {
    /// Serves a peer node's `Ends` call (see `service`): VNI offers are held in the store
    /// (refused when the VNI is taken here), removals set the end down; the pass that
    /// follows does the kernel work.
    pub async fn ends(&self, req: EndsRequest) -> EndsReply {
        let from = req.from.unwrap_or_default();
        let mut results = Vec::with_capacity(req.ends.len());
        for end in req.ends {
            results.push(self.one_end(&from, end).await);
        }
        self.kick.notify_one();
        EndsReply { results }
    }

    async fn one_end(&self, from: &Hello, msg: End) -> EndResult {
        // The caller's end; its peer is this node's end.
        let end = match convert::from_message(&msg) {
            Ok(end) => end,
            Err(e) => return refuse(e.to_string()),
        };
        let key = (end.namespace.clone(), end.peer_pod.clone());
        let Some(pod) = self.pods.lock().expect("pods lock").get(&key).cloned() else {
            return refuse(format!("pod {}/{} is not on this node", end.namespace, end.peer_pod));
        };
        let id = end.peer_id;
        if let Some(control) = &msg.control {
            return match self.controlled(id, &from.address, &msg, control).await {
                Ok(()) => accept(),
                Err(reason) => refuse(reason),
            };
        }
        if end.state == WireState::Down {
            self.peer_end_gone(id, &pod.netns).await;
            return accept();
        }
        if end.kind != LinkKind::Vxlan {
            return accept();
        }
        let Some(link) = self
            .source
            .topology(&end.namespace, &end.peer_pod)
            .and_then(|t| t.spec.links.iter().find(|l| l.uid == end.link_uid).cloned())
        else {
            return refuse(format!("pod {} has no link {}", end.peer_pod, end.link_uid));
        };
        let mut r = plan::record(
            &end.namespace,
            &end.peer_pod,
            &pod.netns,
            &link,
            LinkKind::Vxlan,
            from.address.clone(),
        );
        // The offered VNI, 0 included (what the caller proposed is what is held).
        r.vni = Some(msg.vni);
        r.state = WireState::Pending;
        // Keep a built end's record as is when the offer matches it (a repeated call).
        let existing = self.store.run(move |db| db.wire(id)).await.ok().flatten();
        if existing
            .as_ref()
            .is_some_and(|e| e.vni == r.vni && e.peer_node == from.address && e.netns == pod.netns)
        {
            return accept();
        }
        if let Some(e) = existing.filter(|e| e.kind == LinkKind::Vxlan) {
            // Re-pointed or re-numbered: the pass rebuilds it from the new record.
            r.state = if e.state.is_up() { WireState::Pending } else { e.state };
        }
        match self.store.run(move |db| db.put_wire(&r)).await {
            Ok(()) => accept(),
            Err(StoreError::VniTaken { vni, .. }) => refuse(format!("VNI {vni} is taken on this node")),
            Err(e) => refuse(e.to_string()),
        }
    }

    /// The peer of end `id` went away: its worker and interface go down, its record
    /// says so (a veth end has no remote peer and is left alone).
    async fn peer_end_gone(&self, id: u64, netns: &str) {
        if let Some(dp) = self.dataplane() {
            dp.set_up(id, false);
        }
        let rec = self.store.run(move |db| db.wire(id)).await.ok().flatten();
        if let Some(mut r) = rec.filter(|r| r.kind.crosses_nodes()) {
            let (netns, intf) = (netns.to_string(), r.local_intf.clone());
            if let Err(e) = self.kernel(move |k| k.set_interface_up(&netns, &intf, false)).await {
                debug!(wire = id, error = %e, "could not set a wire end down");
            }
            r.state = WireState::Down;
            let _ = self.store.run(move |db| db.put_wire(&r)).await;
        }
    }
}
