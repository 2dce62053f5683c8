//! DEL: cutting a pod off at once, tearing it down after, and spooling a DEL the store cannot record.

use tracing::{Instrument, info, warn};
use weft_cni::spool::{self, SpooledDel};
use weft_cni::{Cmd, CniError};
use weft_failpoint::failpoint;
use weft_portmap::Entries;
use weft_store::{Attachment, AttachmentKey, PortMapping, State, StoreError};

use crate::call::CniCall;
use crate::seams::{Ipam, PodNetworking};

use super::Handler;
use super::convert::decode;
use super::convert::host_port_entries;
use super::errors::store_err;

impl<I: Ipam, K: PodNetworking> Handler<I, K> {
    /// DEL: detach the pod. Succeeds when there is nothing to remove. Answers once the
    /// pod is cut off; the veth pair is removed right after, and the addresses are
    /// released only when that is done.
    ///
    /// When the store cannot record the DEL (its disk is full), the DEL goes into the
    /// DEL spool, the pod is cut off and its veth pair removed, and DEL succeeds: the
    /// replay of the spool releases the addresses once the store writes again.
    pub async fn del(&self, args: &CniCall) -> Result<(), CniError> {
        self.del_with(args, true).await
    }

    /// DEL as the spool's replay does it: a store that cannot write fails it (the
    /// entry stays for the next replay) instead of spooling it again.
    pub(crate) async fn del_now(&self, args: &CniCall) -> Result<(), CniError> {
        self.del_with(args, false).await
    }

    async fn del_with(&self, args: &CniCall, may_spool: bool) -> Result<(), CniError> {
        let (_conf, key) = decode(args, Cmd::Del)?;
        let _guard = self
            .locks
            .lock(&args.container_id)
            .instrument(phase!("lock_wait"))
            .await;
        failpoint!("del.lock");
        if self.teardowns.pending(&key) {
            return Ok(());
        }
        let begun = self.ipam.begin_del(key.clone()).instrument(phase!("ipam")).await;
        let att = match begun {
            Ok(Some(att)) => att,
            Ok(None) => return Ok(()),
            Err(e) if may_spool && e.cannot_write() && self.del_spool().is_some() => {
                return self.spool_unrecorded_del(args, &key, e).await;
            }
            Err(e) => return Err(store_err(e)),
        };
        failpoint!("del.intent");
        if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&att))
            && self.is_last_of_pod(&att).await
        {
            w.pod_removed(pod).instrument(phase!("wires")).await;
        }
        self.start_teardown(att).await;
        Ok(())
    }

    /// Whether `att` is the last network of its pod that is not being torn down: the
    /// pod's wires go only with it (a DEL of `net1` leaves the pod and its links).
    pub(super) async fn is_last_of_pod(&self, att: &Attachment) -> bool {
        match self.ipam.container_attachments(att.key.container_id.clone()).await {
            Ok(all) => !all.iter().any(|o| o.id != att.id && o.state != State::Deleting),
            Err(e) => {
                warn!(attachment = %att.key, error = %e, "cannot tell whether the pod has other networks; removing its wires");
                true
            }
        }
    }

    /// Cuts the pod off now and finishes its teardown in the background.
    pub(super) async fn start_teardown(&self, att: Attachment) -> Option<tokio::task::JoinHandle<()>> {
        let ticket = self.teardowns.start(&att.key)?;
        self.cut_off(&att).await;
        if let Some(policy) = &self.policy {
            policy.pod_detached(&att.host_ifname);
        }
        let (net, ipam, gateway_lock) = (self.net.clone(), self.ipam.clone(), self.gateways.clone());
        let frees_gateway = super::holds_node_gateway(&att);
        let key = att.key.clone();
        let work = async move {
            match net.remove(att.host_ifname.clone()).await {
                Ok(_) => {
                    failpoint!("del.veth");
                    match ipam.remove(att.id).await {
                        Ok(()) => {
                            failpoint!("del.release");
                            if frees_gateway {
                                crate::gateways::release_unused(ipam.as_ref(), net.as_ref(), &gateway_lock).await;
                            }
                            info!(attachment = %key, "pod detached")
                        }
                        Err(e) => {
                            warn!(attachment = %key, error = %e, "veth removed but the row stays; retried at next start")
                        }
                    }
                }
                Err(e) => {
                    warn!(attachment = %key, error = %e, "could not remove the veth pair; retried at next start")
                }
            }
            drop(ticket);
        };
        Some(tokio::spawn(work.instrument(phase!("teardown"))))
    }

    /// A DEL the store failed to record because it cannot write: it goes into the DEL
    /// spool, which is replayed once the store writes again (and ahead of the pod's next
    /// ADD), and the kernel side goes now, so that the success DEL answers holds for
    /// everything but the rows. While the entry waits, reconcile neither rebuilds the
    /// pod's veth nor puts its host ports back. The spool lives beside the socket, on
    /// another file system than the state as a rule; when it cannot be written either,
    /// the DEL fails and the runtime retries it.
    async fn spool_unrecorded_del(
        &self,
        args: &CniCall,
        key: &AttachmentKey,
        cause: StoreError,
    ) -> Result<(), CniError> {
        let Some(spool) = self.del_spool() else {
            return Err(store_err(cause));
        };
        let del = SpooledDel {
            network: key.network.clone(),
            container_id: key.container_id.clone(),
            ifname: key.ifname.clone(),
            netns: args.netns.clone(),
            args: args.args.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            config: String::from_utf8_lossy(&args.config).into_owned(),
            spooled_at_ms: spool::now_ms(),
        };
        let dir = spool.dir().to_path_buf();
        let written = tokio::task::spawn_blocking(move || spool::write(&dir, &del))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(e) = written {
            let mut err = store_err(cause);
            err.details = format!("{}; the DEL could not be spooled either: {e}", err.details);
            return Err(err);
        }
        warn!(attachment = %key, error = %cause, "the state store cannot record this DEL: spooled until it can, the pod's networking goes now");
        match self.ipam.get(key.clone()).await {
            Ok(Some(att)) => {
                self.cut_off(&att).await;
                if let Err(e) = self.net.remove(att.host_ifname.clone()).await {
                    warn!(attachment = %key, error = %e, "could not remove the veth pair; the spooled DEL's replay retries");
                }
            }
            Ok(None) => {}
            Err(e) => {
                warn!(attachment = %key, error = %e, "cannot read the attachment; its veth pair goes when the spooled DEL is replayed")
            }
        }
        Ok(())
    }

    /// What DEL does to the kernel before it answers: the pod's host ports go and its
    /// host end is set down.
    async fn cut_off(&self, att: &Attachment) {
        // The ports were released in the store with the DEL; take them out of the
        // kernel before answering, so a new pod may have them at once.
        if !att.ports.is_empty() {
            let removed = self
                .net
                .remove_host_ports(host_port_entries(&att.host_ifname, &att.ports))
                .instrument(phase!("nftables"))
                .await;
            if let Err(e) = removed {
                warn!(attachment = %att.key, error = %e, "could not remove host ports; the table sync will");
            }
            failpoint!("del.hostports");
            self.hand_over_host_ports(att).await;
        }
        if let Err(e) = self
            .net
            .disconnect(att.host_ifname.clone())
            .instrument(phase!("disconnect"))
            .await
        {
            warn!(attachment = %att.key, error = %e, "could not set the host end down; removing it anyway");
        }
        failpoint!("del.disconnect");
    }

    /// Points the kernel at the attachments that took over `att`'s host ports: another
    /// network of the same container that asked for the same mapping (the store handed
    /// it over when `att`'s DEL began).
    async fn hand_over_host_ports(&self, att: &Attachment) {
        let same = |m: &PortMapping, h: &PortMapping| {
            (m.host_ip, m.host_port, m.protocol.as_str(), m.container_ip.is_ipv6())
                == (h.host_ip, h.host_port, h.protocol.as_str(), h.container_ip.is_ipv6())
        };
        let held = match self.ipam.held_ports().await {
            Ok(h) => h,
            Err(e) => {
                warn!(attachment = %att.key, error = %e, "cannot read who holds the host ports now; the table sync will");
                return;
            }
        };
        let mut heirs = Entries::default();
        for h in held
            .iter()
            .filter(|h| h.key != att.key && att.ports.iter().any(|m| same(m, &h.mapping)))
        {
            let e = host_port_entries(&h.host_ifname, std::slice::from_ref(&h.mapping));
            heirs.ports.extend(e.ports);
            heirs.hairpins.extend(
                e.hairpins
                    .into_iter()
                    .filter(|x| !heirs.hairpins.contains(x))
                    .collect::<Vec<_>>(),
            );
        }
        if heirs.ports.is_empty() {
            return;
        }
        info!(attachment = %att.key, mappings = heirs.ports.len(), "host ports pass to another network of the container");
        if let Err(e) = self.net.add_host_ports(heirs).await {
            warn!(attachment = %att.key, error = %e, "could not hand the host ports over; the table sync will");
        }
    }
}
