//! Request builders of the agent's API and accessors of what comes back.

use fabric_agent::proto::agent as pb;

/// A partition on fabric `fab1`.
pub fn partition(id: &str, pkey: u32) -> pb::Partition {
    pb::Partition {
        id: id.into(),
        name: id.trim_start_matches("ibpart_").into(),
        workspace: "ws".into(),
        account: "acct".into(),
        fabric: "fab1".into(),
        pkey,
    }
}

/// An attach request.
pub fn attach(
    instance: &str,
    p: pb::Partition,
    wait_ms: Option<u32>,
) -> pb::AttachPartitionRequest {
    pb::AttachPartitionRequest {
        partition: Some(p),
        instance_id: instance.into(),
        membership: pb::Membership::Full as i32,
        wait_ms,
        grant: None,
        ports: Vec::new(),
    }
}

/// The state of an attachment as the enum.
pub fn state(a: &pb::Attachment) -> pb::AttachmentState {
    pb::AttachmentState::try_from(a.state).expect("known state")
}

/// A release request.
pub fn release_request(instance: &str, wait_ms: Option<u32>) -> pb::ReleaseInstanceRequest {
    pb::ReleaseInstanceRequest {
        instance_id: instance.into(),
        wait_ms,
    }
}

/// Whether a P_Key table holds `base` with either membership bit.
pub fn has_base(keys: &[u16], base: u16) -> bool {
    keys.iter().any(|k| k & 0x7fff == base)
}

/// An attach request naming the instance's ports as `device/port` (e.g. `sim0/2`).
pub fn attach_on(
    instance: &str,
    p: pb::Partition,
    ports: &[&str],
    wait_ms: Option<u32>,
) -> pb::AttachPartitionRequest {
    let mut r = attach(instance, p, wait_ms);
    r.ports = ports
        .iter()
        .map(|s| {
            let (device, n) = s.rsplit_once('/').expect("device/port");
            pb::PortName {
                device: device.into(),
                port_number: n.parse().expect("port number"),
                port_guid: String::new(),
            }
        })
        .collect();
    r
}
