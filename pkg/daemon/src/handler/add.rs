//! ADD: attaching a pod, and undoing an ADD that cannot finish.

use tracing::{Instrument, info, warn};
use weft_cni::args::{IP, MAC};
use weft_cni::request::{self};
use weft_cni::{CNIResult, Cmd, CniError, Code, result};
use weft_failpoint::failpoint;
use weft_store::{Attachment, BeginAdd, InstalledRoute, NewAttachment, State, StoreError};

use crate::call::CniCall;
use crate::naming;
use crate::seams::{Ipam, PodNetworking, WiredPod, Wiring};

use super::Handler;
use super::checks::{check_existing_matches, check_requested, check_route_gateways};
use super::convert::{cni_result, host_port_entries, pod_network};
use super::convert::{decode, installed_route, pod_ref, port_requests, route_request};
use super::errors::{kernel_err, store_err};

impl<I: Ipam, K: PodNetworking> Handler<I, K> {
    /// ADD: attach the pod, or return the stored result if it is attached already.
    pub async fn add(&self, args: &CniCall) -> Result<Vec<u8>, CniError> {
        let (conf, key) = decode(args, Cmd::Add)?;
        // A DEL of this attachment spooled while weftd was away came first.
        self.replay_spooled_del(&key).await?;
        let eff = self.effective(&conf, Cmd::Add)?;
        let asked = request::requested(
            &conf,
            args.args.get(IP).map(String::as_str),
            args.args.get(MAC).map(String::as_str),
        )?;
        check_requested(&asked, &eff.ranges)?;
        check_route_gateways(&conf, &eff.ranges)?;
        self.check_netns(&args.netns).await?;
        let _guard = async {
            let guard = self.locks.lock(&args.container_id).await;
            self.teardowns.wait(&key).await;
            guard
        }
        .instrument(phase!("lock_wait"))
        .await;
        failpoint!("add.lock");

        let spec = NewAttachment {
            key: key.clone(),
            netns: args.netns.clone(),
            pod: pod_ref(args),
            host_ifname: naming::host_ifname(&key.container_id, &key.ifname),
            mtu: eff.mtu,
            ranges: eff.ranges,
            ports: port_requests(&conf),
            requested: asked.ips.iter().map(|r| r.address).collect(),
            pod_mac: asked.mac,
        };
        let begun = self.begin_add(&spec).instrument(phase!("ipam")).await;
        let att = match begun? {
            BeginAdd::Existing(att) if att.state == State::Ready => {
                check_existing_matches(&att, &asked)?;
                let stored: CNIResult = att
                    .result
                    .as_deref()
                    .and_then(|r| serde_json::from_str(r).ok())
                    .ok_or_else(|| CniError::new(Code::Store, format!("stored result of {key} is unreadable")))?;
                info!(attachment = %key, "ADD repeated: returning the stored result");
                return Ok(result::render(
                    conf.version,
                    &result::merge_prev(conf.prev_result.as_ref(), &stored),
                ));
            }
            BeginAdd::Existing(stale) => {
                // Left by an interrupted ADD or teardown: finish removing it, then start over.
                warn!(attachment = %key, state = stale.state.as_str(), "replacing an unfinished attachment");
                self.finish_teardown(&stale).await?;
                match self.begin_add(&spec).await? {
                    BeginAdd::Created(att) => att,
                    BeginAdd::Existing(_) => {
                        return Err(CniError::new(
                            Code::Internal,
                            format!("attachment {key} reappeared while replacing it"),
                        ));
                    }
                }
            }
            BeginAdd::Created(att) => att,
        };
        failpoint!("add.ipam");

        let routes = match route_request(&conf, &att) {
            Ok(r) => r,
            Err(e) => {
                self.undo_add(&att).await;
                return Err(e);
            }
        };
        let net = pod_network(&att);
        let set_up = async {
            // Shared with other setups: no gateway goes between holding it and routing
            // from it (crate::gateways).
            let set = {
                let _gateways = self.gateways.read().await;
                self.net.setup(net.clone(), routes).await
            };
            let installed: Vec<InstalledRoute> = match set {
                Ok(r) => r.iter().map(installed_route).collect(),
                Err(e) => return Err(kernel_err(e)),
            };
            if !att.ports.is_empty() {
                let added = self
                    .net
                    .add_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                    .instrument(phase!("nftables"))
                    .await;
                if let Err(e) = added {
                    let _ = self
                        .net
                        .remove_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                        .await;
                    let _ = self.net.remove(att.host_ifname.clone()).await;
                    return Err(kernel_err(e));
                }
                failpoint!("add.hostports");
            }
            Ok(installed)
        };
        // The pod's policies are put in place while its network is set up (the engine
        // needs its addresses and host interface name, known since `ipam`), as a task
        // of its own so that another worker thread runs it. The ADD still answers only
        // once both are done.
        let policed = self.policy.clone().zip(Self::policed(&att));
        let place = async {
            let Some((policy, pod)) = policed.clone() else {
                return Ok(());
            };
            let placing = tokio::spawn(async move { policy.pod_attached(pod).await }.instrument(phase!("policy")));
            placing
                .await
                .unwrap_or_else(|e| Err(format!("placing the pod's policies failed: {e}")))
        };
        let (set_up, placed) = tokio::join!(set_up, place);
        let installed = match (set_up, placed) {
            (Ok(installed), Ok(())) => installed,
            (Err(e), placed) => {
                if let (Some((policy, pod)), Ok(())) = (&policed, placed) {
                    // Its elements go with the pass this asks for: the pod never became
                    // ready.
                    policy.pod_detached(&pod.host_ifname);
                }
                self.undo_add(&att).await;
                return Err(e);
            }
            (Ok(_), Err(why)) => {
                if !att.ports.is_empty() {
                    let _ = self
                        .net
                        .remove_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                        .await;
                }
                let _ = self.net.remove(att.host_ifname.clone()).await;
                self.undo_add(&att).await;
                if let Some((policy, pod)) = &policed {
                    policy.pod_detached(&pod.host_ifname);
                }
                return Err(CniError::new(
                    Code::TryAgainLater,
                    format!(
                        "{}: {why}; nothing was set up and the ADD can be retried",
                        att.pod.describe(&att.key.container_id)
                    ),
                ));
            }
        };
        let ours = cni_result(&att, &net, &installed);
        let json = serde_json::to_string(&ours).expect("CNI results serialize");
        failpoint!("add.commit");
        if let Err(e) = self
            .ipam
            .finish_add(att.id, json, installed)
            .instrument(phase!("store_commit"))
            .await
        {
            let _ = self.net.remove(att.host_ifname.clone()).await;
            self.undo_add(&att).await;
            return Err(store_err(e));
        }
        failpoint!("add.done");
        self.note_ranges(&att);
        info!(attachment = %key, host_ifname = %att.host_ifname, addresses = ?att.addresses.iter().map(|a| a.address).collect::<Vec<_>>(), "pod attached");
        if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&att)) {
            w.pod_added(pod.clone()).instrument(phase!("wires")).await;
            let waited = w
                .wait_links(pod.clone(), conf.wait_for_links)
                .instrument(phase!("wait_links"))
                .await;
            if let Err(why) = waited {
                warn!(attachment = %key, error = %why, "the pod's links did not come up in time: removing the attachment");
                self.abandon_add(&att, w.as_ref(), pod).await;
                return Err(CniError::new(
                    Code::TryAgainLater,
                    format!(
                        "{}: {why}; the attachment was removed and the ADD can be retried",
                        att.pod.describe(&att.key.container_id)
                    ),
                ));
            }
        }
        Ok(result::render(
            conf.version,
            &result::merge_prev(conf.prev_result.as_ref(), &ours),
        ))
    }

    /// Records the attachment and allocates its addresses. A requested address held by
    /// an attachment being torn down (a pod deleted and made again with the same
    /// address, as `podman run --ip` after `podman rm`) frees up within milliseconds:
    /// that teardown is waited for and the allocation tried once more, instead of
    /// refusing.
    async fn begin_add(&self, spec: &NewAttachment) -> Result<BeginAdd, CniError> {
        match self.ipam.begin_add(spec.clone()).await {
            Err(StoreError::AddressTaken {
                key, deleting: true, ..
            }) if self.teardowns.pending(&key) => {
                info!(attachment = %spec.key, holder = %key, "the requested address is being released: waiting for it");
                self.teardowns.wait(&key).await;
                self.ipam.begin_add(spec.clone()).await.map_err(store_err)
            }
            other => other.map_err(store_err),
        }
    }

    async fn undo_add(&self, att: &Attachment) {
        if let Err(e) = self.ipam.remove(att.id).await {
            // The row stays in state `creating`; the next start rolls it back.
            warn!(attachment = %att.key, error = %e, "could not release the addresses of a failed ADD");
            return;
        }
        self.release_gateways_of(att).await;
    }

    /// Takes back a finished ADD whose pod's links did not come up in time, as a DEL
    /// would (wires, host ports, veth, addresses), waiting for all of it, so the
    /// failed ADD leaves nothing behind.
    async fn abandon_add(&self, att: &Attachment, wiring: &dyn Wiring, pod: WiredPod) {
        if self.is_last_of_pod(att).await {
            wiring.pod_removed(pod).await;
        }
        match self.ipam.begin_del(att.key.clone()).await {
            Ok(Some(att)) => {
                if let Some(work) = self.start_teardown(att).await {
                    let _ = work.await;
                }
            }
            Ok(None) => {}
            Err(e) => {
                warn!(attachment = %att.key, error = %e, "could not record the removal of an abandoned ADD; the next start finishes it")
            }
        }
    }

    /// Removes the kernel side and the row of an attachment, waiting for both.
    async fn finish_teardown(&self, att: &Attachment) -> Result<(), CniError> {
        self.net.remove(att.host_ifname.clone()).await.map_err(kernel_err)?;
        self.ipam.remove(att.id).await.map_err(store_err)?;
        self.release_gateways_of(att).await;
        Ok(())
    }
}
