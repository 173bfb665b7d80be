//! The configuration's parsing and validation, end to end.

use super::*;
use crate::domain::Guid;

fn parse(s: &str) -> Result<Config, ConfigError> {
    Config::parse(s, Path::new("test.toml"))
}

#[test]
fn minimal_config_gets_defaults() {
    let c = parse("fabric = \"fab1\"\nnode_id = \"n1\"\n").unwrap();
    assert_eq!(c.subnet_manager.backend, Backend::Embedded);
    assert_eq!(c.observer_kind(), ObserverKind::Embedded);
    assert_eq!(c.listen.socket_mode(), 0o660);
}

#[test]
fn unknown_keys_and_bad_values_are_rejected() {
    assert!(matches!(
        parse("fabric = \"f\"\nbogus = 1\n"),
        Err(ConfigError::Parse { .. })
    ));
    assert!(matches!(
        parse("fabric = \"a b\"\n"),
        Err(ConfigError::Invalid { .. })
    ));
    let plain_public =
        "fabric = \"f\"\n[listen]\ntcp = \"0.0.0.0:7443\"\ninsecure_plaintext_for_tests = true\n";
    assert!(matches!(
        parse(plain_public),
        Err(ConfigError::Invalid {
            key: "listen.insecure_plaintext_for_tests",
            ..
        })
    ));
    let old_switch =
        "fabric = \"f\"\n[listen]\ntcp = \"127.0.0.1:7443\"\nplaintext_loopback = true\n";
    match parse(old_switch) {
        Err(ConfigError::Invalid { key, reason }) => {
            assert_eq!(key, "listen.plaintext_loopback");
            assert!(
                reason.contains("insecure_plaintext_for_tests = true"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let no_tls = "fabric = \"f\"\n[listen]\ntcp = \"127.0.0.1:7443\"\n";
    assert!(matches!(
        parse(no_tls),
        Err(ConfigError::Invalid {
            key: "listen.tcp",
            ..
        })
    ));
    let ok =
        "fabric = \"f\"\n[listen]\ntcp = \"127.0.0.1:7443\"\ninsecure_plaintext_for_tests = true\n";
    assert!(parse(ok).is_ok());
    for bad in [
        "max_watch_streams = 0",
        "max_in_flight_requests = 0",
        "request_timeout_secs = 600",
        "watch_batch = 0",
        "watch_batch = 5000",
        "list_default_page_size = 0",
        "list_default_page_size = 20\nlist_max_page_size = 10",
        "keepalive_timeout_secs = 0",
    ] {
        assert!(
            matches!(
                parse(&format!("fabric = \"f\"\n[limits]\n{bad}\n")),
                Err(ConfigError::Invalid { .. })
            ),
            "{bad}"
        );
    }
    let limits = parse("fabric = \"f\"\n[limits]\nmax_watch_streams = 8192\n").unwrap();
    assert_eq!(limits.limits.max_watch_streams, 8192);
    assert_eq!(limits.limits.request_timeout_secs, 660);
    let mismatch =
        "fabric = \"f\"\n[subnet_manager]\nbackend = \"remote\"\n[subnet_manager.remote]\n\
                    endpoint = \"http://127.0.0.1:1\"\n[observer]\nkind = \"embedded\"\n";
    assert!(matches!(
        parse(mismatch),
        Err(ConfigError::Invalid {
            key: "observer.kind",
            ..
        })
    ));
}

#[test]
fn identifiers_are_typed_once() {
    let c = parse(
        "fabric = \"fab1\"\nnode_id = \"n1\"\n[ports]\nguids = [\"0002:c903:000e:0b72\"]\n[listen]\nunix_socket_mode = \"0o600\"\n",
    )
    .unwrap();
    assert_eq!(c.node_id.as_str(), "n1");
    assert_eq!(c.fabric.as_str(), "fab1");
    assert_eq!(c.ports.guids, vec![Guid(0x0002_c903_000e_0b72)]);
    assert_eq!(c.listen.socket_mode(), 0o600);
    let host = parse("fabric = \"f\"\n").unwrap();
    let expected = crate::sys::host::hostname().unwrap_or_else(|| "localhost".to_owned());
    assert_eq!(host.node_id.as_str(), expected);
    for (text, key) in [
        ("node_id = \"a b\"\n", "node_id"),
        ("[ports]\nguids = [\"0xzz\"]\n", "ports.guids"),
    ] {
        match parse(&format!("fabric = \"f\"\n{text}")) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{text}: {other:?}"),
        }
    }
    for mode in ["0999", "1777", "rw"] {
        match parse(&format!(
            "fabric = \"f\"\n[listen]\nunix_socket_mode = \"{mode}\"\n"
        )) {
            Err(ConfigError::Parse { message, .. }) => {
                assert!(message.contains("expected octal"), "{message}")
            }
            other => panic!("{mode}: {other:?}"),
        }
    }
}

fn tls(lists: &str) -> String {
    format!(
        "fabric = \"f\"\n[listen]\ntcp = \"0.0.0.0:7443\"\n[listen.tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n{lists}"
    )
}

#[test]
fn allowlists_are_typed() {
    assert!(parse(&tls(
        "allowed_clients = [\"dns:cp.example\", \"uri:spiffe://f/cp\"]\n"
    ))
    .is_ok());
    match parse(&tls("allowed_clients = [\"cp.example\"]\n")) {
        Err(ConfigError::Section { key, source }) => {
            assert_eq!(key, "listen.tls.allowed_clients");
            assert_eq!(
                source.downcast_ref::<crate::api::ClientIdError>(),
                Some(&crate::api::ClientIdError::Untyped("cp.example".into()))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        parse(&tls("partitions_clients = [\"node1\"]\n")),
        Err(ConfigError::Section {
            key: "listen.tls.partitions_clients",
            ..
        })
    ));
    assert!(matches!(
        parse(&tls("")),
        Err(ConfigError::Invalid {
            key: "listen.tls.allowed_clients",
            ..
        })
    ));
    assert!(parse(&tls(
        "partitions_clients = [\"dns:*.nodes.f.example\"]\noperator_clients = [\"cn:ops\"]\nnode_name_template = \"{node}.nodes.f.example\"\n"
    ))
    .is_ok());
    assert!(matches!(
        parse(&tls(
            "partitions_clients = [\"dns:a\"]\nnode_name_template = \"nodes.f.example\"\n"
        )),
        Err(ConfigError::Section {
            key: "listen.tls.node_name_template",
            ..
        })
    ));
    assert!(parse(&tls(
        "partitions_clients = [\"dns:a\"]\n[listen.tls.node_identities]\n\"dns:a\" = \"node1\"\n"
    ))
    .is_ok());
    assert!(matches!(
        parse("fabric = \"f\"\n[listen]\nread_group = \"\"\n"),
        Err(ConfigError::Invalid {
            key: "listen.read_group",
            ..
        })
    ));
}

#[test]
fn grants_section_is_checked_and_files_are_read_at_load() {
    let c = parse("fabric = \"fab1\"\nnode_id = \"n1\"\n").unwrap();
    assert!(
        !c.grants.require,
        "absent: not required (a loud warning at start)"
    );
    let dir = tempfile::tempdir().unwrap();
    let good = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        ed25519_dalek::SigningKey::from_bytes(&[5; 32])
            .verifying_key()
            .as_bytes(),
    );
    std::fs::write(dir.path().join("k.pub"), &good).unwrap();
    let with = |keys: &str| {
        parse(&format!(
            "fabric = \"fab1\"\nnode_id = \"n1\"\n[grants]\nrequire = true\n{keys}"
        ))
    };
    let c = with(&format!(
        "[[grants.keys]]\nid = \"a\"\npublic_key = \"{good}\"\nnot_after = \"2027-01-01T00:00:00Z\"\n\
         [[grants.keys]]\nid = \"b\"\npublic_key_file = \"{}\"\n",
        dir.path().join("k.pub").display()
    ))
    .unwrap();
    let policy = c.grants.load().unwrap();
    assert_eq!((policy.require, policy.keys.len()), (true, 2));
    assert_eq!(policy.fabric.as_str(), "fab1");
    // A missing key file passes the syntax check and fails the load.
    let c =
        with("[[grants.keys]]\nid = \"a\"\npublic_key_file = \"/nonexistent/k.pub\"\n").unwrap();
    assert!(c
        .grants
        .load()
        .unwrap_err()
        .to_string()
        .contains("cannot read"));
    for (keys, says) in [
        ("", "at least one"),
        ("[[grants.keys]]\nid = \"a\"\n", "exactly one of"),
        ("[[grants.keys]]\nid = \"a\"\npublic_key = \"!!\"\n", "not base64"),
        ("[[grants.keys]]\nid = \"a b\"\npublic_key = \"x\"\n", "key id"),
        (
            &format!("[[grants.keys]]\nid = \"a\"\npublic_key = \"{good}\"\nnot_before = \"soon\"\n"),
            "RFC 3339",
        ),
        (
            &format!("[[grants.keys]]\nid = \"a\"\npublic_key = \"{good}\"\n[[grants.keys]]\nid = \"a\"\npublic_key = \"{good}\"\n"),
            "twice",
        ),
    ] {
        let e = with(keys).unwrap_err().to_string();
        assert!(e.contains(says), "{keys}: {e}");
    }
}

#[test]
fn a_ufm_broker_needs_the_ufm_backend_and_a_tcp_listener() {
    let ufm =
        "[subnet_manager.ufm]\nurl = \"http://127.0.0.1:9\"\ncredentials_file = \"/x/ufm.cred\"\n";
    let broker = "[subnet_manager.ufm_broker]\nenabled = true\n";
    let listen = "[listen]\ntcp = \"127.0.0.1:7443\"\ninsecure_plaintext_for_tests = true\n";
    let key = |r: Result<Config, ConfigError>| match r {
        Err(ConfigError::Invalid { key, reason }) => (key, reason),
        other => panic!("{other:?}"),
    };
    // Another backend.
    let (k, why) = key(parse(&format!(
        "fabric = \"f\"\n{listen}[subnet_manager]\nbackend = \"embedded\"\n{broker}"
    )));
    assert_eq!(k, "subnet_manager.ufm_broker");
    assert!(why.contains("backend = \"ufm\""), "{why}");
    // No TCP listener for the nodes.
    let (k, why) = key(parse(&format!(
        "fabric = \"f\"\n[subnet_manager]\nbackend = \"ufm\"\n{ufm}{broker}"
    )));
    assert_eq!(k, "subnet_manager.ufm_broker");
    assert!(why.contains("[listen] tcp"), "{why}");
    // Both: a broker.
    let c = parse(&format!(
        "fabric = \"f\"\n{listen}[subnet_manager]\nbackend = \"ufm\"\n{ufm}{broker}"
    ))
    .unwrap();
    assert!(c.subnet_manager.ufm_broker());
    // Off, or absent: the direct mode.
    let c = parse(&format!(
        "fabric = \"f\"\n[subnet_manager]\nbackend = \"ufm\"\n{ufm}[subnet_manager.ufm_broker]\nenabled = false\n"
    ))
    .unwrap();
    assert!(!c.subnet_manager.ufm_broker());
}
