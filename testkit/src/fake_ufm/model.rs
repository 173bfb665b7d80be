//! The fake UFM's state: partitions with GUID -> membership, index0 and ip_over_ib, and the
//! request handling rules of the documented endpoints (validation included). Pure: no I/O.

use fabric_agent::domain::Membership;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// One GUID in a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeMember {
    /// Full or limited.
    pub membership: Membership,
    /// Key stored at index 0 of the port's table.
    pub index0: bool,
}

/// One partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakePartition {
    /// UFM's name for it (`api_pkey_0xa12` when created through the API).
    pub name: String,
    /// Whether it carries IPoIB.
    pub ip_over_ib: bool,
    /// Members by port GUID.
    pub members: BTreeMap<u64, FakeMember>,
}

/// One port of UFM's port inventory (`GET …/resources/ports`), with the fields of the public
/// UFM REST API guide's port objects that the broker reads (the rest are left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakePort {
    /// Port GUID.
    pub guid: u64,
    /// The host UFM shows the port in.
    pub system_name: String,
    /// `<hostname> <device>` by default.
    pub node_description: String,
    /// `Computer IB Port` or `Switch IB Port`.
    pub description: String,
}

impl FakePort {
    /// A host's port.
    pub fn host(guid: u64, host: &str, device: &str) -> FakePort {
        FakePort {
            guid,
            system_name: host.into(),
            node_description: format!("{host} {device}"),
            description: "Computer IB Port".into(),
        }
    }

    /// UFM's JSON for the port.
    pub fn json(&self) -> Value {
        json!({
            "guid": format!("{:016x}", self.guid),
            "name": format!("{:016x}_1", self.guid),
            "number": 1,
            "system_name": self.system_name,
            "node_description": self.node_description,
            "description": self.description,
            "logical_state": "Active",
            "physical_state": "LinkUp",
        })
    }
}

/// Behaviours of real UFM versions, switchable.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quirks {
    /// A missing key answers `200 {}` on GET instead of 404.
    pub missing_key_empty_object: bool,
    /// A partition is deleted when its last GUID leaves.
    pub delete_emptied_partitions: bool,
    /// `POST …/actions/remove_guids_from_pkey` answers 404 (the deprecated form is gone).
    pub remove_action_gone: bool,
    /// Writes answer 200 but change nothing (a UFM that loses requests).
    pub ignore_writes: bool,
    /// `GET …/resources/pkeys/last_updated` answers 404 (a UFM without the stamp).
    pub no_last_updated: bool,
    /// Changes leave `last_updated` as it was (a stamp whose tick is coarser than the
    /// changes, or a UFM restored from an old state).
    pub frozen_last_updated: bool,
}

/// An answer: status and JSON body.
pub type Reply = (u16, Value);

/// Partitions and quirks.
#[derive(Debug, Default)]
pub struct Model {
    /// Partitions by 15-bit key.
    pub partitions: BTreeMap<u16, FakePartition>,
    /// The port inventory.
    pub ports: Vec<FakePort>,
    /// Quirks in force.
    pub quirks: Quirks,
    /// UFM's partition stamp, microseconds since the epoch, moved by every accepted change
    /// (strictly increasing). 0: no change yet (the endpoint answers `null`).
    pub last_updated_us: u64,
}

fn error(status: u16, message: impl Into<String>) -> Reply {
    (status, json!({ "error": message.into() }))
}

fn parse_pkey(text: &str) -> Result<u16, String> {
    let hex = text
        .strip_prefix("0x")
        .ok_or_else(|| format!("pkey {text:?} must be a hex string like 0x0a12"))?;
    let v = u32::from_str_radix(hex, 16).map_err(|_| format!("pkey {text:?} is not hex"))?;
    if v == 0 || v >= 0x7fff {
        return Err(format!(
            "pkey {text:?} must be between 0x0 and 0x7fff exclusive"
        ));
    }
    Ok(v as u16)
}

fn parse_guid(text: &str) -> Result<u64, String> {
    if !(16..=20).contains(&text.len()) {
        return Err(format!("guid {text:?} must be 16-20 characters"));
    }
    let hex = text.strip_prefix("0x").unwrap_or(text);
    u64::from_str_radix(hex, 16).map_err(|_| format!("guid {text:?} is not hex"))
}

fn guid_list(body: &Map<String, Value>) -> Result<Vec<u64>, String> {
    let Some(Value::Array(list)) = body.get("guids") else {
        return Err("guids must be a list".into());
    };
    if list.is_empty() {
        return Err("guids must not be empty".into());
    }
    list.iter()
        .map(|g| {
            g.as_str()
                .ok_or("guids must be strings".to_string())
                .and_then(parse_guid)
        })
        .collect()
}

fn object(body: Option<&Value>) -> Result<&Map<String, Value>, String> {
    match body {
        Some(Value::Object(m)) => Ok(m),
        _ => Err("body must be a JSON object".into()),
    }
}

impl Model {
    /// Moves the partition stamp (every accepted change does).
    pub fn touch(&mut self) {
        if self.quirks.frozen_last_updated {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.last_updated_us = now.max(self.last_updated_us + 1);
    }

    /// `GET …/resources/pkeys/last_updated`.
    pub fn last_updated(&self) -> Reply {
        if self.quirks.no_last_updated {
            return error(404, "Not Found");
        }
        let stamp = match self.last_updated_us {
            0 => Value::Null,
            us => json!(format!("{}.{:06}", us / 1_000_000, us % 1_000_000)),
        };
        (200, json!({ "last_updated": stamp }))
    }

    /// The JSON UFM returns for one partition.
    pub fn partition_json(p: &FakePartition, guids_data: bool) -> Value {
        let mut doc = json!({ "partition": p.name, "ip_over_ib": p.ip_over_ib });
        if guids_data {
            doc["guids"] = p
                .members
                .iter()
                .map(|(g, m)| {
                    json!({ "guid": format!("{g:016x}"), "membership": m.membership.to_string(), "index0": m.index0 })
                })
                .collect();
        }
        doc
    }

    /// `GET …/resources/pkeys[?guids_data=true]`.
    pub fn list(&self, guids_data: bool) -> Reply {
        let map: Map<String, Value> = self
            .partitions
            .iter()
            .map(|(k, p)| (format!("0x{k:x}"), Self::partition_json(p, guids_data)))
            .collect();
        (200, Value::Object(map))
    }

    /// `GET …/resources/pkeys/{pkey}[?guids_data=true]`.
    pub fn get(&self, pkey: &str, guids_data: bool) -> Reply {
        let key = match parse_pkey(pkey) {
            Ok(k) => k,
            Err(e) => return error(400, e),
        };
        match self.partitions.get(&key) {
            Some(p) => (200, Self::partition_json(p, guids_data)),
            None if self.quirks.missing_key_empty_object => (200, json!({})),
            None => error(404, format!("pkey {pkey} not found")),
        }
    }

    /// `POST …/resources/pkeys`: adds GUIDs, creating the partition when absent. Returns the
    /// changed key.
    pub fn add(&mut self, body: Option<&Value>) -> (Reply, Option<u16>) {
        match self.try_add(body) {
            Ok(key) => ((200, json!({})), Some(key)),
            Err(e) => (error(400, e), None),
        }
    }

    fn try_add(&mut self, body: Option<&Value>) -> Result<u16, String> {
        let body = object(body)?;
        let allowed = ["pkey", "guids", "membership", "index0", "ip_over_ib"];
        if let Some(unknown) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!("unknown field {unknown:?}"));
        }
        let key = parse_pkey(
            body.get("pkey")
                .and_then(Value::as_str)
                .ok_or("pkey must be a string")?,
        )?;
        let guids = guid_list(body)?;
        let membership = match body.get("membership") {
            None => Membership::Full,
            Some(Value::String(m)) if m == "full" => Membership::Full,
            Some(Value::String(m)) if m == "limited" => Membership::Limited,
            Some(other) => {
                return Err(format!(
                    "membership {other} must be \"full\" or \"limited\""
                ))
            }
        };
        let flag = |name: &str, default: bool| match body.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(format!("{name} must be a boolean")),
        };
        let index0 = flag("index0", false)?;
        let ip_over_ib = flag("ip_over_ib", true)?;
        if self.quirks.ignore_writes {
            return Ok(key);
        }
        let partition = self.partitions.entry(key).or_insert_with(|| FakePartition {
            name: format!("api_pkey_0x{key:x}"),
            ip_over_ib,
            members: BTreeMap::new(),
        });
        partition.ip_over_ib = ip_over_ib;
        for g in guids {
            partition
                .members
                .insert(g, FakeMember { membership, index0 });
        }
        self.touch();
        Ok(key)
    }

    /// `POST …/actions/remove_guids_from_pkey`.
    pub fn remove_action(&mut self, body: Option<&Value>) -> (Reply, Option<u16>) {
        if self.quirks.remove_action_gone {
            return (error(404, "Not Found"), None);
        }
        let parsed = object(body).and_then(|b| {
            let key = parse_pkey(
                b.get("pkey")
                    .and_then(Value::as_str)
                    .ok_or("pkey must be a string")?,
            )?;
            Ok((key, guid_list(b)?))
        });
        match parsed {
            Ok((key, guids)) => self.remove(key, &guids),
            Err(e) => (error(400, e), None),
        }
    }

    /// `DELETE …/resources/pkeys/{pkey}/guids/{g1,g2}`.
    pub fn remove_resource(&mut self, pkey: &str, guids: &str) -> (Reply, Option<u16>) {
        let parsed = parse_pkey(pkey).and_then(|k| {
            let list: Result<Vec<u64>, String> = guids.split(',').map(parse_guid).collect();
            Ok((k, list?))
        });
        match parsed {
            Ok((key, list)) => self.remove(key, &list),
            Err(e) => (error(400, e), None),
        }
    }

    fn remove(&mut self, key: u16, guids: &[u64]) -> (Reply, Option<u16>) {
        let Some(partition) = self.partitions.get_mut(&key) else {
            return (error(404, format!("pkey 0x{key:x} not found")), None);
        };
        if self.quirks.ignore_writes {
            return ((200, json!({})), Some(key));
        }
        for g in guids {
            partition.members.remove(g);
        }
        if partition.members.is_empty() && self.quirks.delete_emptied_partitions {
            self.partitions.remove(&key);
        }
        self.touch();
        ((200, json!({})), Some(key))
    }

    /// `DELETE …/resources/pkeys/{pkey}`.
    pub fn delete(&mut self, pkey: &str) -> (Reply, Option<u16>) {
        match parse_pkey(pkey) {
            Ok(key) if self.partitions.remove(&key).is_some() => {
                self.touch();
                ((200, json!({})), Some(key))
            }
            Ok(_) => (error(404, format!("pkey {pkey} not found")), None),
            Err(e) => (error(400, e), None),
        }
    }

    /// Every key (with membership) a GUID holds.
    pub fn keys_of(&self, guid: u64) -> Vec<(u16, Membership)> {
        self.partitions
            .iter()
            .filter_map(|(k, p)| p.members.get(&guid).map(|m| (*k, m.membership)))
            .collect()
    }
}
