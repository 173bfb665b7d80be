//! UFM backend cost: HTTP requests per apply and apply latency against the in-process fake UFM
//! (loopback, no TLS). Prints a table; run with `cargo bench --bench ufm` (`-- --applies N` per
//! latency row, default 200).

use testkit::fake_ufm;
// The ledger in a real store file, as the agent keeps it (every save is an fsync).
use fabric_agent::daemon::StoredUfmLedger;
mod support;

use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{MemoryLedgerStore, UfmConfig, UfmLedgerStore, UfmSm};
use fabric_agent::sm::SubnetManager;
use fabric_agent::store::Store;
use fake_ufm::{FakeAuth, FakeUfm};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PORTS: u64 = 8;
/// The request budget the bench's backends get: high enough never to pace an apply.
const UNPACED: u32 = 1_000_000;

fn node(keys: impl IntoIterator<Item = u16>) -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse("bench-node").unwrap(),
        port_guids: (0..PORTS)
            .map(|p| Guid(0x0002_c903_0000_0000 + p))
            .collect(),
        keys: keys
            .into_iter()
            .map(|k| {
                (
                    PKey::new(u32::from(k)).expect("valid key"),
                    KeySetting {
                        membership: Membership::Full,
                        name: format!("p{k}"),
                        ports: None,
                    },
                )
            })
            .collect(),
    }
}

async fn backend(dir: &std::path::Path, fake: &FakeUfm, ledger: Arc<dyn UfmLedgerStore>) -> UfmSm {
    let cred = dir.join("ufm.cred");
    std::fs::write(&cred, "admin:123456\n").expect("write credentials");
    let mut config = UfmConfig::with_credentials_file(fake.url(), cred);
    // The per-agent budget (default 20 requests/s after a burst of 64) would pace these
    // back-to-back applies: lifted, so the rows measure the backend and UFM.
    config.max_requests_per_sec = UNPACED;
    config.request_burst = UNPACED;
    UfmSm::new(&config, ledger).expect("backend")
}

async fn requests_of(fake: &FakeUfm, sm: &UfmSm, desired: &NodeMemberships) -> usize {
    fake.clear_requests();
    sm.apply(desired, 0).await.expect("apply");
    fake.request_count()
}

/// Applies per latency row (`--applies`, default 200).
fn applies() -> usize {
    usize::try_from(support::arg("--applies", 200).max(1)).expect("--applies")
}

async fn latency(sm: &UfmSm, desired: &[NodeMemberships]) -> (Duration, Duration) {
    let runs = applies();
    let mut times = Vec::with_capacity(runs);
    for i in 0..runs {
        let d = &desired[i % desired.len()];
        let t = Instant::now();
        sm.apply(d, 0).await.expect("apply");
        times.push(t.elapsed());
    }
    let p = |q| support::percentile(&times, q).expect("at least one apply");
    (p(0.5), p(0.99))
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    println!("UFM backend, {PORTS} port GUIDs per node, fake UFM on loopback ({} applies per latency row, request budget lifted to {UNPACED}/s)", applies());
    println!();
    println!("| keys | first apply | no-change re-apply | release all | re-apply p50 / p99 ms | one-key change p50 / p99 ms | one-key change, ledger in a store file, p50 / p99 ms | re-apply p50 / p99 ms, UFM +2 ms/request |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [1u16, 8, 32] {
        let fake = FakeUfm::start_with(FakeAuth::Basic {
            user: "admin".into(),
            password: "123456".into(),
        })
        .await;
        let sm = backend(dir.path(), &fake, Arc::new(MemoryLedgerStore::new())).await;
        let keys: Vec<u16> = (0..n).map(|i| 0x0100 + i).collect();
        let all = node(keys.clone());
        let first = requests_of(&fake, &sm, &all).await;
        let again = requests_of(&fake, &sm, &all).await;
        let release = requests_of(&fake, &sm, &node([])).await;

        sm.apply(&all, 0).await.expect("apply");
        let steady = latency(&sm, std::slice::from_ref(&all)).await;
        // One key attached then released on top of the others, alternately.
        let plus_one = node(keys.iter().copied().chain([0x0fff]));
        let change = latency(&sm, &[plus_one.clone(), all.clone()]).await;
        let file = Store::open(&dir.path().join(format!("state-{n}.redb")), 1_000).expect("store");
        let durable = backend(dir.path(), &fake, Arc::new(StoredUfmLedger(Arc::new(file)))).await;
        durable.apply(&all, 0).await.expect("apply");
        let change_durable = latency(&durable, &[plus_one, all.clone()]).await;
        fake.set_delay(Duration::from_millis(2));
        let slow = latency(&sm, std::slice::from_ref(&all)).await;
        println!(
            "| {n} | {first} | {again} | {release} | {} / {} | {} / {} | {} / {} | {} / {} |",
            ms(steady.0),
            ms(steady.1),
            ms(change.0),
            ms(change.1),
            ms(change_durable.0),
            ms(change_durable.1),
            ms(slow.0),
            ms(slow.1)
        );
    }
}
