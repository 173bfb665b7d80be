use super::*;
use crate::sm::opensm::store::InMemoryNodeStore;

struct Fixed(Mutex<PeerSmCheck>);

#[async_trait]
impl FenceEvidence for Fixed {
    async fn check(&self, _guid: u64) -> PeerSmCheck {
        self.0.lock().unwrap().clone()
    }
}

fn fences(check: PeerSmCheck, ledger: Arc<InMemoryNodeStore>) -> (Fences, Arc<Fixed>) {
    fences_after(check, ledger, Duration::ZERO)
}

fn fences_after(
    check: PeerSmCheck,
    ledger: Arc<InMemoryNodeStore>,
    fence_after: Duration,
) -> (Fences, Arc<Fixed>) {
    let evidence = Arc::new(Fixed(Mutex::new(check)));
    let f = Fences::new(
        "sm1".into(),
        vec![PeerIdentity {
            endpoint: "http://127.0.0.1:2".into(),
            name: Some("sm2".into()),
            sm_port_guid: Some(0x22),
        }],
        Some(evidence.clone()),
        Some(ledger),
        fence_after,
    )
    .unwrap();
    (f, evidence)
}

const PEER: &str = "http://127.0.0.1:2";

fn heard(caught_up: bool, behind: Option<String>) -> Heard {
    Heard {
        stated: "sm2".into(),
        caught_up,
        behind,
    }
}

#[tokio::test]
async fn a_pull_from_a_fenced_peer_ends_its_excuse_but_not_its_fence() {
    let ledger = Arc::new(InMemoryNodeStore::default());
    let (f, _) = fences_after(
        PeerSmCheck::Silent("x".into()),
        ledger.clone(),
        Duration::from_millis(300),
    );
    tokio::time::sleep(Duration::from_millis(320)).await;
    f.after_round(&[(PEER.into(), None)]).await;
    assert_eq!(f.fenced().len(), 1);
    assert_eq!(f.host_set().fenced.len(), 1);
    f.pulled_by("sm9");
    assert_eq!(f.host_set().fenced.len(), 1, "another name changes nothing");
    f.pulled_by("sm2");
    // No longer excused to the nodes; still fenced to the peers, and stored.
    assert!(f.host_set().fenced.is_empty());
    assert_eq!(f.fenced().len(), 1);
    assert_eq!(ledger.load_fenced().unwrap().len(), 1);
    // Lifted once it answers caught up and holds every set.
    f.after_round(&[(PEER.into(), Some(heard(true, None)))])
        .await;
    assert!(f.fenced().is_empty());
    assert!(ledger.load_fenced().unwrap().is_empty());
}

#[tokio::test]
async fn a_stored_fence_is_withdrawn_when_the_silent_peers_sm_answers_again() {
    let ledger = Arc::new(InMemoryNodeStore::default());
    let (f, evidence) = fences(PeerSmCheck::Silent("no answer".into()), ledger.clone());
    f.after_round(&[(PEER.into(), None)]).await;
    assert_eq!(f.fenced().len(), 1);
    // Still silent, still proven dead: the fence holds.
    f.after_round(&[(PEER.into(), None)]).await;
    assert_eq!(f.fenced().len(), 1);
    // Its OpenSM runs again while its agent stays silent: no longer excused.
    *evidence.0.lock().unwrap() = PeerSmCheck::Answers(OpenSmState::Standby);
    f.after_round(&[(PEER.into(), None)]).await;
    assert!(f.fenced().is_empty());
    assert!(ledger.load_fenced().unwrap().is_empty());
    assert!(f.host_set().fenced.is_empty());
    let c = f.conditions();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].kind, ConditionKind::SmHostAgentSilent);
    assert!(
        c[0].detail.contains("fence is withdrawn") && c[0].detail.contains("standby"),
        "{}",
        c[0].detail
    );
    // A restart on the same store does not bring it back.
    let (again, _) = fences(PeerSmCheck::Silent("x".into()), ledger.clone());
    assert!(again.fenced().is_empty());
    // A check that proves nothing withdraws too.
    *evidence.0.lock().unwrap() = PeerSmCheck::Silent("no answer".into());
    f.after_round(&[(PEER.into(), None)]).await;
    assert_eq!(f.fenced().len(), 1);
    *evidence.0.lock().unwrap() = PeerSmCheck::Unknown("SA silent".into());
    f.after_round(&[(PEER.into(), None)]).await;
    assert!(f.fenced().is_empty());
}

#[tokio::test]
async fn a_silent_agent_with_a_silent_sm_is_fenced_durably_and_lifted_when_caught_up() {
    let ledger = Arc::new(InMemoryNodeStore::default());
    let (f, _) = fences(PeerSmCheck::Silent("no answer".into()), ledger.clone());
    f.after_round(&[(PEER.into(), None)]).await;
    assert_eq!(f.fenced().len(), 1);
    assert_eq!(ledger.load_fenced().unwrap()[0].host, "sm2");
    assert_eq!(f.host_set().fenced[0].host, "sm2");
    assert_eq!(f.conditions()[0].kind, ConditionKind::SmHostFenced);
    // A new instance on the same store holds it fenced.
    let (again, _) = fences(PeerSmCheck::Silent("x".into()), ledger.clone());
    assert_eq!(again.fenced().len(), 1);
    // Back but not caught up: stays fenced.
    f.after_round(&[(PEER.into(), Some(heard(false, None)))])
        .await;
    assert_eq!(f.fenced().len(), 1);
    // Caught up, but behind this host on a node: stays fenced.
    f.after_round(&[(
        PEER.into(),
        Some(heard(true, Some("node n1 at generation 3".into()))),
    )])
    .await;
    assert_eq!(f.fenced().len(), 1);
    f.after_round(&[(PEER.into(), Some(heard(true, None)))])
        .await;
    assert!(f.fenced().is_empty());
    assert!(ledger.load_fenced().unwrap().is_empty());
}

#[tokio::test]
async fn an_sm_that_answers_is_never_fenced_and_the_reason_says_what_to_do() {
    let ledger = Arc::new(InMemoryNodeStore::default());
    let (f, evidence) = fences(PeerSmCheck::Answers(OpenSmState::Standby), ledger.clone());
    f.after_round(&[(PEER.into(), None)]).await;
    assert!(f.fenced().is_empty());
    let c = f.conditions();
    assert_eq!(c[0].kind, ConditionKind::SmHostAgentSilent);
    assert!(
        c[0].detail.contains("sm2")
            && c[0].detail.contains("standby")
            && c[0].detail.contains("fence-sm-host sm2")
            && c[0].detail.contains("stop that OpenSM"),
        "{}",
        c[0].detail
    );
    assert!(matches!(
        f.fence_now("sm2").await,
        Err(FenceRefusal::SmAlive(..))
    ));
    *evidence.0.lock().unwrap() = PeerSmCheck::Unknown("SA silent".into());
    assert!(matches!(
        f.fence_now("sm2").await,
        Err(FenceRefusal::Unknown(..))
    ));
    assert!(f.fenced().is_empty());
    *evidence.0.lock().unwrap() = PeerSmCheck::Silent("no answer".into());
    assert_eq!(f.fence_now("sm2").await.unwrap().host, "sm2");
    assert!(f
        .conditions()
        .iter()
        .all(|c| c.kind == ConditionKind::SmHostFenced));
    assert!(matches!(
        f.fence_now("sm9").await,
        Err(FenceRefusal::UnknownPeer(..))
    ));
}

#[tokio::test]
async fn an_agent_that_answers_is_never_fenced() {
    let ledger = Arc::new(InMemoryNodeStore::default());
    let evidence = Arc::new(Fixed(Mutex::new(PeerSmCheck::Silent("x".into()))));
    let f = Fences::new(
        "sm1".into(),
        vec![PeerIdentity {
            endpoint: PEER.into(),
            name: None,
            sm_port_guid: Some(0x22),
        }],
        Some(evidence),
        Some(ledger),
        Duration::from_secs(60),
    )
    .unwrap();
    // A plaintext peer without a configured name that has not answered yet: unknown.
    assert_eq!(f.host_set().known, vec!["sm1".to_owned()]);
    f.after_round(&[(PEER.into(), Some(heard(true, None)))])
        .await;
    assert_eq!(f.host_set().known, vec!["sm1".to_owned(), "sm2".to_owned()]);
    f.after_round(&[(PEER.into(), None)]).await;
    assert!(f.fenced().is_empty());
    assert!(matches!(
        f.fence_now("sm2").await,
        Err(FenceRefusal::AgentAlive(..))
    ));
}
