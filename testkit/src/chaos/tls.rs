//! mTLS on every gRPC link of the campaign, as production runs it, with three CAs of the run's
//! own (generated per run into `<rig dir>/pki/`):
//!
//! - the control plane's CA signs the driver's certificate (`dns:control-plane.fab1.example`):
//!   the node agents take it as their `[listen.tls] client_ca` and allow only that identity
//!   (`allowed_clients`); the SM hosts take it for their operator methods (`operator_clients`:
//!   revoke, list members, retire);
//! - the nodes' CA signs each node's certificate (`dns:<node>.nodes.fab1.example`), served on the
//!   node's API and presented to the SM hosts, which map it to the node by
//!   `node_name_template = "{node}.nodes.fab1.example"`;
//! - the SM hosts' CA signs each SM host's certificate (`dns:<host>.sm.fab1.example` and the
//!   loopback address it is reached at), served to the nodes, the peers and the control plane,
//!   and presented to its peer on every pull (`peer_identities`).
//!
//! An SM host's listener trusts a bundle of the three CAs (its callers are nodes, peers and the
//! control plane). The nodes verify each SM host by the host of its endpoint URL:
//! `[subnet_manager.remote] domain_name` is one name for every endpoint, so two SM hosts reached
//! at one address could not be told apart. The first SM host is therefore reached at 127.0.0.1
//! and the second at 127.0.0.2 (its links listen there), and each states that address as its
//! `host_name`, as the nodes' acknowledgement count requires. The files stay in place for the
//! whole run, so an agent restarted by a fault starts with the same certificates.

use super::observe::AgentApi;
use crate::common::pki::{write, Pki};
use fabric_agent::api::client::ClientTls;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The control plane's certificate identity.
pub const CONTROL_PLANE: &str = "control-plane.fab1.example";

/// The loopback address each SM host is reached at by the nodes and its peer (its name in their
/// eyes); the control plane reaches both at 127.0.0.1 and verifies their DNS names.
pub const SM_ADDRS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)];

/// A node's certificate name.
pub fn node_dns(node: &str) -> String {
    format!("{node}.nodes.fab1.example")
}

/// An SM host's certificate DNS name.
pub fn sm_dns(host: &str) -> String {
    format!("{host}.sm.fab1.example")
}

/// The run's certificate authorities and the files they issued.
pub struct CampaignPki {
    dir: PathBuf,
    nodes: Pki,
    sm_hosts: Pki,
    /// The control plane's CA certificate (the node agents' `client_ca`).
    cp_ca: PathBuf,
    /// The nodes' CA certificate (the control plane verifies the nodes' APIs by it).
    node_ca: PathBuf,
    /// The SM hosts' CA certificate (nodes, peers and the control plane verify SM hosts by it).
    sm_ca: PathBuf,
    /// The three CAs in one bundle: an SM host's `client_ca`.
    sm_client_ca: PathBuf,
    /// The control plane's certificate and key.
    cp: (PathBuf, PathBuf),
}

impl CampaignPki {
    /// Three new CAs and the control plane's certificate, written to `<rig_dir>/pki/`.
    pub fn new(rig_dir: &Path) -> CampaignPki {
        let dir = rig_dir.join("pki");
        std::fs::create_dir_all(&dir).expect("pki dir");
        let cp = Pki::new("fab1 control-plane CA");
        let nodes = Pki::new("fab1 nodes CA");
        let sm_hosts = Pki::new("fab1 SM hosts CA");
        let bundle = format!("{}{}{}", cp.ca.pem(), nodes.ca.pem(), sm_hosts.ca.pem());
        CampaignPki {
            cp_ca: write(&dir, "control-plane-ca.pem", &cp.ca.pem()),
            node_ca: write(&dir, "nodes-ca.pem", &nodes.ca.pem()),
            sm_ca: write(&dir, "sm-hosts-ca.pem", &sm_hosts.ca.pem()),
            sm_client_ca: write(&dir, "sm-client-cas.pem", &bundle),
            cp: cp.issue(&dir, "control-plane", &[CONTROL_PLANE], "control-plane"),
            dir,
            nodes,
            sm_hosts,
        }
    }

    /// A node agent's config (from [`crate::rig::ha::ha_node_config`], plaintext endpoints on
    /// `sm_ports`, host `h` at [`SM_ADDRS`]`[h]`) with its API also on TCP `api_port` over
    /// mTLS (the control plane only) and its endpoints https with its own certificate.
    pub fn node_config(&self, plain: &str, node: &str, api_port: u16, sm_ports: &[u16]) -> String {
        let (cert, key) = self.nodes.issue(&self.dir, node, &[&node_dns(node)], node);
        let plain_endpoints: Vec<String> = sm_ports
            .iter()
            .map(|p| format!("\"http://127.0.0.1:{p}\""))
            .collect();
        let endpoints: Vec<String> = sm_ports
            .iter()
            .zip(SM_ADDRS)
            .map(|(p, ip)| format!("\"https://{ip}:{p}\""))
            .collect();
        let listen = "[subnet_manager]\n";
        let out = replace_once(
            plain,
            &format!("endpoints = [{}]\n", plain_endpoints.join(", ")),
            &format!(
                "endpoints = [{}]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
                endpoints.join(", "),
                self.sm_ca.display(),
                cert.display(),
                key.display()
            ),
        );
        replace_once(
            &out,
            listen,
            &format!(
                "tcp = \"127.0.0.1:{api_port}\"\n[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
                 client_ca = \"{}\"\nallowed_clients = [\"dns:{CONTROL_PLANE}\"]\n{listen}",
                cert.display(),
                key.display(),
                self.cp_ca.display()
            ),
        )
    }

    /// How the control plane reaches node `node`'s API on `api_port`: mTLS with its own
    /// certificate, the node verified by its name.
    pub fn node_api(&self, node: &str, api_port: u16) -> AgentApi {
        self.as_control_plane(api_port, &self.node_ca, node_dns(node))
    }

    /// The control plane's mTLS client for a listener on `port`, verifying the server as
    /// `domain` against `ca`.
    fn as_control_plane(&self, port: u16, ca: &Path, domain: String) -> AgentApi {
        AgentApi::Tcp {
            url: format!("https://127.0.0.1:{port}"),
            tls: ClientTls {
                ca: Some(ca.to_path_buf()),
                identity: Some(self.cp.clone()),
                domain: Some(domain),
            },
        }
    }

    /// SM host `index`'s config (from [`crate::rig::ha::ha_sm_config`] with its one peer's
    /// plaintext link on `peer_link`) served over mTLS instead of plaintext (nodes by the name
    /// template, the peer by its identity, the control plane as operator), pulling its peer
    /// over https at the peer's address with its own certificate.
    pub fn sm_config(&self, plain: &str, index: usize, names: [&str; 2], peer_link: u16) -> String {
        let (me, peer) = (names[index], names[1 - index]);
        let (cert, key) = self.sm_hosts.issue(
            &self.dir,
            me,
            &[&sm_dns(me), &SM_ADDRS[index].to_string()],
            me,
        );
        let out = replace_once(
            plain,
            "insecure_plaintext_for_tests = true\n",
            &format!(
                "[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
                 partitions_clients = [\"dns:*.nodes.fab1.example\", \"dns:{}\"]\n\
                 operator_clients = [\"dns:{CONTROL_PLANE}\"]\n\
                 node_name_template = \"{{node}}.nodes.fab1.example\"\n",
                cert.display(),
                key.display(),
                self.sm_client_ca.display(),
                sm_dns(peer),
            ),
        );
        replace_once(
            &out,
            &format!("peers = [\"http://127.0.0.1:{peer_link}\"]\n"),
            &format!(
                "peers = [\"https://{}:{peer_link}\"]\npeer_identities = [\"dns:{}\"]\n\
                 ca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\nhost_name = \"{}\"\n",
                SM_ADDRS[1 - index],
                sm_dns(peer),
                self.sm_ca.display(),
                cert.display(),
                key.display(),
                SM_ADDRS[index],
            ),
        )
    }

    /// How the control plane reaches SM host `name`'s Partitions listener on `port`: mTLS as
    /// an operator, the host verified by its DNS name.
    pub fn sm_api(&self, name: &str, port: u16) -> AgentApi {
        self.as_control_plane(port, &self.sm_ca, sm_dns(name))
    }
}

/// `text` with its one occurrence of `from` replaced by `to`; panics when it has none or
/// several (the plaintext config changed shape).
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "expected one {from:?} in the config:\n{text}"
    );
    text.replacen(from, to, 1)
}
