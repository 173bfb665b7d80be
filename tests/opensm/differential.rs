//! Differential campaign: randomized operator files fed both to the strict parser and to a real
//! OpenSM 3.3 on an ibsim fabric; they must agree on accept/reject for every file. OpenSM's
//! verdict is read from its log with the sweep fence: the file is written, OpenSM swept once
//! (the sweep may have started before the write), then swept again; only the lines of that
//! second sweep (after the first `SUBNET UP`) count, so a previous file's errors never do.
//!
//! The short run (every file of `tests/fixtures/partitions` plus 40 random files, seed printed)
//! runs in the normal test run; `FABRIC_OPENSM_CAMPAIGN=N` runs N random files
//! (`FABRIC_OPENSM_CAMPAIGN_SEED` fixes the seed). A disagreement fails the test printing the
//! file; it becomes a fixture under `tests/fixtures/partitions` with its `.expect`. Skipped when
//! ibsim/OpenSM are not installed.

use testkit::rig;

use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::reload::verdict;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rig::{Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The number of `-> SUBNET UP` lines in `text`, and the byte just past the last one.
fn subnet_ups(text: &str) -> (usize, usize) {
    let mut n = 0;
    let mut end = 0;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        at += line.len();
        if line.ends_with('\n') && line.trim_end().ends_with("-> SUBNET UP") {
            n += 1;
            end = at;
        }
    }
    (n, end)
}

/// Waits until OpenSM's log after byte `from` holds a complete `SUBNET UP` line; returns the
/// offset just past it.
fn wait_sweep(fabric: &Fabric, from: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = fabric.opensm_log();
        let (n, end) = subnet_ups(log.get(from..).unwrap_or_default());
        if n > 0 {
            return from + end;
        }
        assert!(Instant::now() < deadline, "no SUBNET UP after byte {from}");
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// OpenSM's verdict on `text`: true when it drops the file (the fence's second sweep logged an
/// error line).
fn opensm_rejects(fabric: &Fabric, text: &[u8]) -> bool {
    let tmp = fabric.dir().join("partitions.conf.campaign");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, fabric.partitions_path()).unwrap();
    let mark = fabric.opensm_log().len();
    fabric.hup_opensm();
    let first = wait_sweep(fabric, mark);
    fabric.hup_opensm();
    let second = wait_sweep(fabric, first);
    let log = fabric.opensm_log();
    let lines: Vec<String> = log[first..second].lines().map(str::to_owned).collect();
    !verdict(&lines).0.is_empty()
}

/// One random operator file.
fn random_file(rng: &mut StdRng) -> String {
    const NAMES: &[&str] = &[
        "Default",
        "storage",
        "tenant_a",
        "t",
        "x-y.z",
        "naïve",
        "分区",
        "a_very_long_partition_name_over_31_characters",
        "",
        "Default",
    ];
    const KEYWORDS: &[&str] = &[
        "ALL",
        "ALL_CAS",
        "ALL_SWITCHES",
        "ALL_ROUTERS",
        "SELF",
        "NONE",
        "A",
        "ALL_C",
        "S",
    ];
    const MEMBERSHIPS: &[&str] = &[
        "", "=full", "=limited", "=both", "=f", "=l", "=b", "=fulll", "=FULL", "=",
    ];
    const FLAGS: &[&str] = &[
        "ipoib",
        "ipoib=1",
        "rate=3",
        "rate=7",
        "mtu=4",
        "mtu=5",
        "sl=1",
        "scope=2",
        "Q_Key=0x0B1B",
        "TClass=0",
        "FlowLabel=0",
        "defmember=full",
        "defmember=limited",
        "defmember=both",
        "indx0",
        "bogus=1",
        "qos",
        "mtu",
    ];
    const SPACES: &[&str] = &[" ", "  ", "\t", "", " \t "];
    let sp = |rng: &mut StdRng| SPACES[rng.random_range(0..SPACES.len())];
    let mut out = String::new();
    if rng.random_bool(0.3) {
        out.push_str("# operator's partitions — généré\n");
    }
    let entries = rng.random_range(0..5usize);
    for i in 0..entries {
        if rng.random_bool(0.2) {
            out.push_str(&format!("#{}comment {i} ✓\n", sp(rng)));
        }
        if rng.random_bool(0.1) {
            out.push('\n');
        }
        let name = if i == 0 && rng.random_bool(0.7) {
            "Default"
        } else {
            NAMES[rng.random_range(0..NAMES.len())]
        };
        out.push_str(sp(rng));
        out.push_str(name);
        let key = match rng.random_range(0..10) {
            0 => String::new(),
            1 => format!("={}", rng.random_range(1..0x7fffu32)),
            2 => format!("=0{:o}", rng.random_range(1..0x7fffu32)),
            3 => "=0x18001".into(),
            4 => "=0xzz".into(),
            _ if name == "Default" => "=0x7fff".into(),
            _ => format!("=0x{:04x}", rng.random_range(1..0x7fffu32)),
        };
        out.push_str(&key);
        for _ in 0..rng.random_range(0..3) {
            out.push_str(&format!(
                ",{}{}",
                sp(rng),
                FLAGS[rng.random_range(0..FLAGS.len())]
            ));
        }
        out.push_str(sp(rng));
        out.push(':');
        let members = rng.random_range(0..4usize);
        for m in 0..members {
            if m > 0 {
                out.push(',');
                if rng.random_bool(0.2) {
                    out.push('\n'); // the member list continues on the next line
                }
            }
            out.push_str(sp(rng));
            let who = match rng.random_range(0..10) {
                0..=3 => KEYWORDS[rng.random_range(0..KEYWORDS.len())].to_owned(),
                4 => "0xzz".into(),
                5 => "node1".into(),
                6 => format!("{}", rng.random_range(1..1_000_000u64)),
                _ => format!("0x{:016x}", 0x100001u64 + 2 * rng.random_range(0..4u64)),
            };
            out.push_str(&who);
            out.push_str(MEMBERSHIPS[rng.random_range(0..MEMBERSHIPS.len())]);
        }
        out.push_str(sp(rng));
        match rng.random_range(0..20) {
            0 => {}                   // no final ';'
            1 => out.push_str("\n;"), // ';' on its own line
            2 => out.push_str(" ; # trailing comment"),
            _ => out.push(';'),
        }
        out.push_str(if rng.random_bool(0.03) { "\r\n" } else { "\n" });
    }
    if rng.random_bool(0.03) {
        // A line longer than OpenSM's line buffer.
        out.push_str(&format!(
            "long=0x0101 :{}ALL_SWITCHES=full;\n",
            " ".repeat(4100)
        ));
    }
    out
}

/// What a campaign saw.
struct Outcome {
    /// Files tried.
    tried: usize,
    /// Files OpenSM rejected.
    rejected: usize,
    /// The disagreements, described.
    disagreements: Vec<String>,
}

/// Every corpus file, then `random` generated ones.
fn campaign(fabric: &Fabric, random: usize, seed: u64) -> Outcome {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/partitions");
    let mut corpus: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    corpus.sort();
    for p in corpus {
        // A file OpenSM crashes on (mgid without a value) is no verdict: skipped.
        let text = std::fs::read(&p).unwrap();
        let expect = std::fs::read_to_string(p.with_extension("expect")).unwrap_or_default();
        if expect.contains("MulticastGroupWithoutValue") {
            continue;
        }
        files.push((p.file_name().unwrap().to_string_lossy().into_owned(), text));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..random {
        files.push((
            format!("random #{i} (seed {seed})"),
            random_file(&mut rng).into_bytes(),
        ));
    }
    let mut disagreements = Vec::new();
    let mut rejected = 0;
    for (name, text) in &files {
        let opensm = opensm_rejects(fabric, text);
        rejected += usize::from(opensm);
        let parser = parse(text);
        if parser.is_err() != opensm {
            disagreements.push(format!(
                "{name}: parser {}, OpenSM {}\n---\n{}\n---",
                match &parser {
                    Ok(_) => "accepts".to_owned(),
                    Err(e) => format!("rejects ({e})"),
                },
                if opensm { "rejects" } else { "accepts" },
                String::from_utf8_lossy(text)
            ));
        }
    }
    Outcome {
        tried: files.len(),
        rejected,
        disagreements,
    }
}

#[test]
fn the_parser_agrees_with_opensm_on_random_operator_files() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 3), LIMITED_DEFAULT_PARTITIONS) else {
        return;
    };
    let long = std::env::var("FABRIC_OPENSM_CAMPAIGN")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let seed = std::env::var("FABRIC_OPENSM_CAMPAIGN_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(rand::random);
    let started = Instant::now();
    let out = campaign(&fabric, long.unwrap_or(40), seed);
    eprintln!(
        "differential campaign: {} files (seed {seed}), OpenSM rejected {}, {} disagreements, {:.1} s",
        out.tried,
        out.rejected,
        out.disagreements.len(),
        started.elapsed().as_secs_f64()
    );
    // Both verdicts occur (a campaign where OpenSM accepts or rejects everything proves little).
    assert!(
        out.rejected > 0 && out.rejected < out.tried,
        "{} of {}",
        out.rejected,
        out.tried
    );
    assert!(
        out.disagreements.is_empty(),
        "{}",
        out.disagreements.join("\n")
    );
}
