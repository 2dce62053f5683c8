//! A carrier of the tests' own, registered in place of VXLAN: the engine drives it
//! through the [`Carrier`] trait alone (build, hold, release, status), which is what a
//! new kind of link needs to be one module and one registration line.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use weft_link::{DownBy, Impairment, LinkChange, LinkKind, LinkPhase, WireEnd, WireState};
use weft_wires::{Carrier, Carriers, Cx, Far, LocalLink, WireError};

use super::fakes::FakePlane;
use super::{Lab, id, link_states};

/// What the test carrier was asked to do, by node: "node verb pod:intf detail".
type Journal = Arc<Mutex<Vec<String>>>;

/// Carries links in memory: an end is "built" by recording it.
struct Journaled {
    node: String,
    journal: Journal,
}

impl Journaled {
    fn note(&self, what: String) {
        self.journal.lock().unwrap().push(format!("{} {what}", self.node));
    }
}

#[async_trait]
impl Carrier<FakePlane> for Journaled {
    fn kind(&self) -> LinkKind {
        LinkKind::Vxlan
    }

    async fn reconcile(&self, cx: &mut Cx<'_, FakePlane>, at: LocalLink<'_>, far: Far<'_>) -> Result<(), WireError> {
        let Far::Node(node) = far else {
            return Err(WireError::Invalid("test carrier: across nodes only".into()));
        };
        let built = cx
            .recorded(at.id())
            .is_some_and(|r| r.kind == LinkKind::Vxlan && r.state.is_up() && r.peer_node == node.to_string());
        if built {
            return Ok(());
        }
        self.note(format!("build {}:{} to {node}", at.name, at.link.local_intf));
        cx.rebuilt(at.id());
        cx.put(at.record(LinkKind::Vxlan, node.to_string())).await
    }

    async fn hold(
        &self,
        _cx: &mut Cx<'_, FakePlane>,
        r: &WireEnd,
        _before: Option<Option<DownBy>>,
        want: Option<DownBy>,
    ) -> Result<bool, WireError> {
        self.note(format!("hold {}:{} {want:?}", r.local_pod, r.local_intf));
        Ok(true)
    }

    async fn impair(&self, _cx: &mut Cx<'_, FakePlane>, r: &WireEnd, imp: Impairment) -> Result<bool, WireError> {
        self.note(format!("impair {}:{} {imp}", r.local_pod, r.local_intf));
        Ok(true)
    }

    async fn release(&self, _cx: &mut Cx<'_, FakePlane>, r: &WireEnd) {
        self.note(format!("release {}:{}", r.local_pod, r.local_intf));
    }

    fn waiting(&self, peer_pod: &str) -> String {
        format!("test carrier waits for {peer_pod}")
    }
}

fn taken(journal: &Journal) -> BTreeSet<String> {
    std::mem::take(&mut *journal.lock().unwrap()).into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_registered_for_a_kind_carries_its_links_with_no_other_change() {
    let journal = Journal::default();
    let mut lab = Lab::new(&["a", "b"]);
    let j = journal.clone();
    lab.carriers = Box::new(move |node| {
        Carriers::standard().with(Journaled {
            node: node.into(),
            journal: j.clone(),
        })
    });
    lab.connect(1, ("r1", "eth1"), ("r2", "eth2"), Some(LinkKind::Vxlan));
    // A same-node link on the same engine still goes to weft's veth carrier.
    lab.connect(2, ("r1", "eth3"), ("r3", "eth1"), None);
    lab.start().await;
    lab.add("a", "r1").await;
    lab.add("a", "r3").await;
    lab.add("b", "r2").await;
    lab.settle().await;

    let (a, b): (IpAddr, IpAddr) = (lab.node("a").addr, lab.node("b").addr);
    assert_eq!(
        taken(&journal),
        BTreeSet::from([format!("a build r1:eth1 to {b}"), format!("b build r2:eth2 to {a}"),])
    );
    // Neither node touched the kernel nor negotiated a VNI for the link: only the
    // registered carrier did anything about it.
    assert_eq!(
        lab.kernel("a").created(),
        vec!["veth /fake/a/r1/eth3 /fake/a/r3/eth1".to_string()]
    );
    assert!(lab.kernel("b").created().is_empty());
    assert!(lab.offers().is_empty());
    let (wa, wb) = (lab.wires("a").await, lab.wires("b").await);
    let (ra, rb) = (&wa[&id("r1", 1)], &wb[&id("r2", 1)]);
    assert_eq!(
        (ra.kind, ra.state, ra.peer_node.clone()),
        (LinkKind::Vxlan, WireState::Up, b.to_string())
    );
    assert_eq!(
        (rb.kind, rb.state, rb.peer_node.clone()),
        (LinkKind::Vxlan, WireState::Up, a.to_string())
    );
    assert!(
        link_states(&lab, "r1")
            .iter()
            .any(|(intf, state, _)| intf == "eth1" && state == LinkPhase::Up.as_str())
    );

    // Down by intent at r1: each node's carrier holds its own end, named or peer.
    lab.engine("a")
        .link_change(None, "r1", "eth1", LinkChange::Down)
        .await
        .unwrap();
    lab.settle().await;
    let held = taken(&journal);
    assert!(held.contains("a hold r1:eth1 Some(Named)"), "{held:?}");
    assert!(held.contains("b hold r2:eth2 Some(Peer)"), "{held:?}");

    // The link leaves the topology: the carrier lets go before the end is removed.
    lab.disconnect(1);
    lab.settle().await;
    let gone = taken(&journal);
    assert!(gone.contains("a release r1:eth1"), "{gone:?}");
    assert!(gone.contains("b release r2:eth2"), "{gone:?}");
    assert!(!lab.wires("a").await.contains_key(&id("r1", 1)));
    assert!(lab.wires("b").await.is_empty());
}
