//! UFM's JSON: the request bodies this backend sends and the partition documents it reads.
//! Pure: no I/O.

use crate::domain::{Guid, Membership, PKey};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// A P_Key as UFM spells it in bodies and paths: `0x0a12`.
pub(crate) fn pkey_text(key: PKey) -> String {
    format!("0x{:04x}", key.base())
}

/// A GUID as UFM spells it: 16 lower-case hex digits, no `0x`, no colons.
pub(crate) fn guid_text(guid: Guid) -> String {
    format!("{:016x}", guid.0)
}

/// Body of `POST …/resources/pkeys` (add GUIDs, creating the partition when absent).
#[derive(Debug, Serialize)]
pub(crate) struct AddGuids {
    /// `0x0a12`.
    pub pkey: String,
    /// GUIDs to add.
    pub guids: Vec<String>,
    /// `full` or `limited`.
    pub membership: Membership,
    /// Store the key at index 0 of the ports' tables.
    pub index0: bool,
    /// The partition carries IPoIB.
    pub ip_over_ib: bool,
}

/// Body of `POST …/actions/remove_guids_from_pkey`.
#[derive(Debug, Serialize)]
pub(crate) struct RemoveGuids {
    /// `0x0a12`.
    pub pkey: String,
    /// GUIDs to remove.
    pub guids: Vec<String>,
}

/// One GUID's entry in a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// Full or limited.
    pub membership: Membership,
    /// Whether UFM keeps the key at index 0 (absent in some versions' answers).
    pub index0: Option<bool>,
}

/// What UFM reports for one partition (GUIDs with membership).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PartitionState {
    /// Members by port GUID.
    pub members: BTreeMap<Guid, Member>,
}

/// A UFM answer this backend does not understand.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A partition answer is not JSON.
    #[error("partition is not JSON: {0}")]
    PartitionJson(#[source] serde_json::Error),
    /// The partition list is not JSON.
    #[error("partition list is not JSON: {0}")]
    ListJson(#[source] serde_json::Error),
    /// The partition list is not an object.
    #[error("partition list is not a JSON object")]
    ListNotObject,
    /// The partition list has a name that is not a P_Key (UFM's text).
    #[error("partition list has a non-P_Key entry {0:?}")]
    ListEntry(String),
    /// A partition is not an object.
    #[error("partition is not a JSON object")]
    PartitionNotObject,
    /// A partition's `guids` is not a list.
    #[error("partition's \"guids\" is not a list")]
    GuidsNotList,
    /// A member has no `guid` string.
    #[error("partition member without a \"guid\" string")]
    MemberWithoutGuid,
    /// A member's GUID is not hex (UFM's text).
    #[error("partition member GUID {0:?} is not hex")]
    MemberGuid(String),
    /// The port inventory is not JSON.
    #[error("port list is not JSON: {0}")]
    PortsJson(#[source] serde_json::Error),
    /// The port inventory is not a list.
    #[error("port list is not a JSON list")]
    PortsNotList,
    /// A port has no `guid` string.
    #[error("port without a \"guid\" string")]
    PortWithoutGuid,
    /// A member's membership is neither full nor limited.
    #[error("partition member {guid} has membership {membership:?}, expected full or limited")]
    MemberMembership {
        /// The member.
        guid: Guid,
        /// UFM's membership text, if any.
        membership: Option<String>,
    },
}

/// Parses `GET …/resources/pkeys/{pkey}?guids_data=true`. `{}` (UFM's answer for a missing key
/// in some versions) is `None`.
pub(crate) fn parse_partition(body: &[u8]) -> Result<Option<PartitionState>, WireError> {
    let value: Value = serde_json::from_slice(body).map_err(WireError::PartitionJson)?;
    partition_from_value(&value)
}

/// Parses `GET …/resources/pkeys?guids_data=true`: an object keyed by P_Key. Keys that are not
/// tenant keys (the default partition 0x7fff) are skipped.
pub(crate) fn parse_all(body: &[u8]) -> Result<BTreeMap<PKey, PartitionState>, WireError> {
    let value: Value = serde_json::from_slice(body).map_err(WireError::ListJson)?;
    let Value::Object(map) = value else {
        return Err(WireError::ListNotObject);
    };
    let mut out = BTreeMap::new();
    for (name, doc) in &map {
        let Some(key) = parse_pkey(name) else {
            if parse_pkey_value(name).is_none() {
                return Err(WireError::ListEntry(name.clone()));
            }
            continue;
        };
        if let Some(state) = partition_from_value(doc)? {
            out.insert(key, state);
        }
    }
    Ok(out)
}

/// Parses `GET …/resources/pkeys/last_updated`: `{"last_updated": "<stamp>"}`, UFM's stamp of
/// its last partition change. The stamp is opaque: it is only compared for equality. `Ok(None)`
/// when it is null or empty (no stamp this time); `Err` when the answer is not such a document
/// (a UFM without the endpoint).
pub(crate) fn parse_last_updated(body: &[u8]) -> Result<Option<String>, ()> {
    let value: Value = serde_json::from_slice(body).map_err(|_| ())?;
    match value.get("last_updated").ok_or(())? {
        Value::String(s) if !s.trim().is_empty() => Ok(Some(s.clone())),
        Value::String(_) | Value::Null => Ok(None),
        _ => Err(()),
    }
}

fn parse_pkey_value(text: &str) -> Option<u32> {
    let hex = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    u32::from_str_radix(hex, 16).ok()
}

/// A tenant key from UFM's spelling (`0xa12`, `0x0a12`).
pub(crate) fn parse_pkey(text: &str) -> Option<PKey> {
    PKey::new(parse_pkey_value(text)?).ok()
}

fn partition_from_value(value: &Value) -> Result<Option<PartitionState>, WireError> {
    let Value::Object(obj) = value else {
        return Err(WireError::PartitionNotObject);
    };
    if obj.is_empty() {
        return Ok(None);
    }
    let mut state = PartitionState::default();
    let guids = match obj.get("guids") {
        None | Some(Value::Null) => return Ok(Some(state)),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(WireError::GuidsNotList),
    };
    for entry in guids {
        let guid = entry
            .get("guid")
            .and_then(Value::as_str)
            .ok_or(WireError::MemberWithoutGuid)?;
        let guid: Guid = guid
            .parse()
            .map_err(|_| WireError::MemberGuid(guid.to_owned()))?;
        let membership = match entry.get("membership").and_then(Value::as_str) {
            Some(m) if m.eq_ignore_ascii_case("full") => Membership::Full,
            Some(m) if m.eq_ignore_ascii_case("limited") => Membership::Limited,
            other => {
                return Err(WireError::MemberMembership {
                    guid,
                    membership: other.map(str::to_owned),
                })
            }
        };
        let index0 = entry.get("index0").and_then(Value::as_bool);
        state.members.insert(guid, Member { membership, index0 });
    }
    Ok(Some(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spells_keys_and_guids_like_ufm() {
        assert_eq!(pkey_text(PKey::new(0x0a12).unwrap()), "0x0a12");
        assert_eq!(pkey_text(PKey::new(0x7ffe).unwrap()), "0x7ffe");
        assert_eq!(guid_text(Guid(0x0002_c903_000e_0b72)), "0002c903000e0b72");
        let body = serde_json::to_value(AddGuids {
            pkey: "0x0a12".into(),
            guids: vec!["0002c903000e0b72".into()],
            membership: Membership::Full,
            index0: false,
            ip_over_ib: true,
        })
        .unwrap();
        assert_eq!(
            body,
            serde_json::json!({"pkey":"0x0a12","guids":["0002c903000e0b72"],"membership":"full","index0":false,"ip_over_ib":true})
        );
    }

    #[test]
    fn reads_a_partition_with_members() {
        let body = br#"{"partition":"api_pkey_0xa12","ip_over_ib":true,"guids":[
            {"guid":"0002c903000e0b72","membership":"full","index0":false},
            {"guid":"0x0002C903000E0B73","membership":"Limited"}]}"#;
        let p = parse_partition(body).unwrap().unwrap();
        assert_eq!(p.members.len(), 2);
        let a = p.members[&Guid(0x0002_c903_000e_0b72)];
        assert_eq!(a.membership, Membership::Full);
        assert_eq!(a.index0, Some(false));
        let b = p.members[&Guid(0x0002_c903_000e_0b73)];
        assert_eq!(b.membership, Membership::Limited);
        assert_eq!(b.index0, None);
    }

    #[test]
    fn empty_object_means_no_such_key() {
        assert_eq!(parse_partition(b"{}").unwrap(), None);
        let p = parse_partition(br#"{"partition":"p","ip_over_ib":true}"#).unwrap();
        assert_eq!(p, Some(PartitionState::default()));
    }

    #[test]
    fn malformed_documents_are_errors() {
        assert!(parse_partition(b"[]").is_err());
        assert!(parse_partition(b"nope").is_err());
        assert!(parse_partition(br#"{"guids":[{"guid":"zz","membership":"full"}]}"#).is_err());
        assert!(parse_partition(br#"{"guids":[{"guid":"01","membership":"both"}]}"#).is_err());
    }

    #[test]
    fn reads_the_last_updated_stamp_only_when_it_is_a_string() {
        assert_eq!(
            parse_last_updated(br#"{"last_updated":"2026-12-03 10:15:00.123456"}"#),
            Ok(Some("2026-12-03 10:15:00.123456".to_string()))
        );
        assert_eq!(parse_last_updated(br#"{"last_updated":null}"#), Ok(None));
        assert_eq!(parse_last_updated(br#"{"last_updated":""}"#), Ok(None));
        assert_eq!(parse_last_updated(br#"{"last_updated":17}"#), Err(()));
        assert_eq!(parse_last_updated(b"{}"), Err(()));
        assert_eq!(parse_last_updated(b"not json"), Err(()));
    }

    #[test]
    fn reads_the_whole_list_and_skips_the_default_partition() {
        let body = br#"{
            "0x7fff":{"partition":"management","ip_over_ib":true,"guids":[{"guid":"0000000000000001","membership":"full"}]},
            "0xa12":{"partition":"a","ip_over_ib":true,"guids":[{"guid":"0000000000000001","membership":"limited"}]},
            "0x0005":{"partition":"b","ip_over_ib":false}}"#;
        let all = parse_all(body).unwrap();
        assert_eq!(all.len(), 2);
        assert!(all.contains_key(&PKey::new(0xa12).unwrap()));
        assert!(all[&PKey::new(5).unwrap()].members.is_empty());
        assert!(parse_all(br#"{"weird":{}}"#).is_err());
    }
}
