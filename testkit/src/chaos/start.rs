//! Starts the campaign's agents on a rig whose two OpenSMs run: an SM-host agent beside each
//! (peers of each other, each peer link through a cuttable proxy) and the node agents (remote
//! backend to both SM hosts, each path through a cuttable proxy of its own), with every gRPC link
//! over mTLS ([`super::tls`]) or, for comparison, plaintext on loopback.

use super::observe::AgentApi;
use super::tls::{CampaignPki, SM_ADDRS};
use crate::common::net::free_port;
use crate::rig::agents::Agent;
use crate::rig::ha::{ha_node_config, ha_sm_config, SmHostAgent, TwoSmFiles};
use crate::rig::link::CuttableLink;
use crate::rig::Fabric;

/// The SM-host agents' names.
pub const SM_NAMES: [&str; 2] = ["smhost", "smhost2"];

/// The agents and links started, and how the control plane reaches each agent's API.
pub struct Started {
    /// The SM-host agents, [`SM_NAMES`] in order.
    pub sm_agents: Vec<SmHostAgent>,
    /// The first SM host's link to the second, and the second's to the first.
    pub peer_links: [CuttableLink; 2],
    /// Per node: its links to the first and to the second SM host.
    pub node_links: Vec<[CuttableLink; 2]>,
    /// The node agents, in the order of the names.
    pub agents: Vec<Agent>,
    /// How the control plane reaches each node agent's API.
    pub node_apis: Vec<AgentApi>,
    /// How the control plane reaches each SM host's Partitions service (as an operator).
    pub sm_apis: Vec<AgentApi>,
}

/// Starts both SM-host agents and the node agents `names`; `extra` (the grants section) ends
/// every config, `mutation_env` is set for the node agents only; with `tls` every gRPC link is
/// mTLS with certificates made for this run in `<rig dir>/pki/` (kept for every restart).
pub fn start_agents(
    fabric: &Fabric,
    files: &TwoSmFiles,
    names: &[String],
    extra: &str,
    mutation_env: &[(String, String)],
    tls: bool,
) -> Started {
    let pki = tls.then(|| CampaignPki::new(fabric.dir()));
    // The second SM host's links listen on its own address under mTLS (its name to its clients).
    let addr = |h: usize| if tls { SM_ADDRS[h] } else { SM_ADDRS[0] };
    let ports = [free_port(), free_port()];
    let peer_links = [
        CuttableLink::start_on(addr(1), ports[1]),
        CuttableLink::start_on(addr(0), ports[0]),
    ];
    let sm_files = [files.sm_a(), files.sm_b()];
    let sm_agents = (0..2)
        .map(|h| {
            let peer = peer_links[h].port();
            let plain = ha_sm_config(fabric, SM_NAMES[h], ports[h], &sm_files[h], &[peer]);
            let config = match &pki {
                Some(pki) => pki.sm_config(&plain, h, SM_NAMES, peer),
                None => plain,
            };
            SmHostAgent::start(fabric, SM_NAMES[h], &(config + extra))
        })
        .collect();
    let node_links: Vec<[CuttableLink; 2]> = names
        .iter()
        .map(|_| {
            [
                CuttableLink::start_on(addr(0), ports[0]),
                CuttableLink::start_on(addr(1), ports[1]),
            ]
        })
        .collect();
    let mut node_apis = Vec::new();
    let agents = names
        .iter()
        .zip(&node_links)
        .map(|(n, l)| {
            let links = [l[0].port(), l[1].port()];
            let plain = ha_node_config(fabric, n, &links);
            let config = match &pki {
                Some(pki) => {
                    let api_port = free_port();
                    node_apis.push(pki.node_api(n, api_port));
                    pki.node_config(&plain, n, api_port, &links)
                }
                None => {
                    node_apis.push(AgentApi::Unix(fabric.dir().join(format!("{n}.sock"))));
                    plain
                }
            };
            Agent::start_with_env(fabric, n, &(config + extra), mutation_env)
        })
        .collect();
    let sm_apis = (0..2)
        .map(|h| match &pki {
            Some(pki) => pki.sm_api(SM_NAMES[h], ports[h]),
            None => AgentApi::Tcp {
                url: format!("http://127.0.0.1:{}", ports[h]),
                tls: Default::default(),
            },
        })
        .collect();
    Started {
        sm_agents,
        peer_links,
        node_links,
        agents,
        node_apis,
        sm_apis,
    }
}
