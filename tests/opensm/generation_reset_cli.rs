//! `fabric-agent reset-node-generation`, the documented recovery of a node stranded at the
//! generation bound, run as an operator runs it on an SM host (the binary, the host's config and
//! store): refused while the agent holds the store, then the stranded node's generation is reset
//! to 0 with its set kept and the other node untouched; a second run refuses, changing nothing.

use testkit::common;

use common::memberships::memberships;
use common::process::BIN;
use fabric_agent::daemon::{StoredSmNodes, STORE_FILE};
use fabric_agent::domain::Membership;
use fabric_agent::sm::opensm::generation_bound::NODE_GENERATION_MAX;
use fabric_agent::sm::opensm::store::StoredNode;
use fabric_agent::sm::opensm::NodeMembershipStore;
use fabric_agent::store::Store;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

fn run(config: &Path, node: &str) -> Output {
    Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(["reset-node-generation", node])
        .output()
        .expect("run the CLI")
}

fn open(dir: &Path) -> StoredSmNodes {
    StoredSmNodes(Arc::new(
        Store::open(&dir.join("state").join(STORE_FILE), 1000).unwrap(),
    ))
}

fn generations(dir: &Path) -> Vec<(String, u64, usize)> {
    open(dir)
        .load_all()
        .unwrap()
        .into_iter()
        .map(|n| {
            (
                n.memberships.node_id.to_string(),
                n.generation,
                n.memberships.keys.len(),
            )
        })
        .collect()
}

#[test]
fn the_reset_command_recovers_only_the_stranded_node() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::create_dir_all(d.join("state")).unwrap();
    let config = d.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = \"smhost\"\nfabric = \"fab1\"\nstate_dir = \"{0}/state\"\n[listen]\n\
             unix_socket = \"{0}/a.sock\"\n[subnet_manager]\nbackend = \"opensm\"\n\
             [subnet_manager.opensm]\npartitions_file = \"{0}/p.conf\"\n\
             log_file = \"{0}/opensm.log\"\npid_file = \"{0}/opensm.pid\"\n",
            d.display()
        ),
    )
    .unwrap();
    let set =
        |node: &str, key: u32| memberships(node, [0x10], [(key, Membership::Full)], |_| "t".into());
    {
        let store = open(d);
        store
            .put_group(
                &[
                    StoredNode::new(set("node1", 0x0a11), NODE_GENERATION_MAX),
                    StoredNode::new(set("node2", 0x0a21), 7),
                ],
                None,
            )
            .unwrap();
        // The agent still runs (holds the store): refused, exit 71.
        let out = run(&config, "node1");
        assert_eq!(out.status.code(), Some(71), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("stop the agent"));
    }
    let out = run(&config, "node1");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("every other SM host"));
    let mut after = generations(d);
    after.sort();
    assert_eq!(
        after,
        vec![("node1".into(), 0, 1), ("node2".into(), 7, 1)],
        "node1 reset with its set kept, node2 untouched"
    );
    // Not stranded any more, and a node not stored: exit 65, nothing changed.
    for node in ["node1", "node2", "node3"] {
        let out = run(&config, node);
        assert_eq!(out.status.code(), Some(65), "{node}: {out:?}");
    }
    let mut again = generations(d);
    again.sort();
    assert_eq!(again, after);
}
