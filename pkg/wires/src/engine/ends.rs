//! The server side of `Ends`: what a peer node tells this one about the ends of links
//! whose other end is here. An offer goes to the end's carrier (VXLAN holds the VNI
//! in the store, or refuses it when it is taken here); a removal sets the end down at
//! once (its pod should not send into nothing until the next pass); the pass that
//! follows does the rest.

use tracing::debug;
use weft_link::WireState;
use weft_rpc::wire::{End, EndResult, EndsReply, EndsRequest, Hello};

use super::Engine;
use super::carrier::{accept, refuse};
use crate::convert;
use crate::plane::GrpcPlane;

impl<P: GrpcPlane> Engine<P> {
    /// Serves a peer node's `Ends` call (see `service`): VNI offers are held in the store
    /// (refused when the VNI is taken here), removals set the end down; the pass that
    /// follows does the kernel work.
    pub async fn ends(&self, req: EndsRequest) -> EndsReply {
        let from = req.from.unwrap_or_default();
        // The pods whose ends the caller spoke of: the pass that follows looks at them.
        let pods: Vec<_> = req
            .ends
            .iter()
            .map(|e| (e.namespace.clone(), e.peer_pod.clone()))
            .collect();
        let mut results = Vec::with_capacity(req.ends.len());
        for end in req.ends {
            results.push(self.one_end(&from, end).await);
        }
        self.passes.kick_pods(pods);
        EndsReply { results }
    }

    async fn one_end(&self, from: &Hello, msg: End) -> EndResult {
        // The caller's end; its peer is this node's end.
        let end = match convert::from_message(&msg) {
            Ok(end) => end,
            Err(e) => return refuse(e.to_string()),
        };
        let key = (end.namespace.clone(), end.peer_pod.clone());
        let Some(pod) = self.pod(&key) else {
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
        self.carriers
            .get(end.kind)
            .offered(self, &from.address, &end, &msg, &pod)
            .await
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
            self.records_written();
        }
    }
}
