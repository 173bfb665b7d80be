//! OpenSM's log lines read by structure, and the only lines whose verdict the agent trusts.
//!
//! OpenSM 3.3 writes every message as `Mon DD HH:MM:SS uuuuuu [THREAD] 0xLL -> MESSAGE`
//! (`osm_log`/`osm_log_v2`: month name or `???`, `%02d` day, `%02d:%02d:%02d`, `%06d`
//! microseconds, `[%04X]` thread, `0x%02x` level). Messages logged through `OSM_LOG` start
//! with the logging function's name and `: `; a few are logged without one (`SUBNET UP`,
//! `Entering MASTER state`).
//!
//! Many messages carry fabric-supplied text: a NodeDescription (`drop_mgr_remove_port:
//! Removed port ... of node:<description>`), which root on any node sets through sysfs. A
//! substring or suffix match on the log can therefore be fed by a tenant's host. So a verdict
//! comes only from a line whose prefix has OpenSM's exact shape, whose level is the one OpenSM
//! logs that message at, and whose *whole* message (function name included) equals the form
//! OpenSM prints ([`Verdict::of_line`]):
//!
//! | verdict | level | message |
//! |---|---|---|
//! | sweep ended | `0x02`, `0x80` | `SUBNET UP` (`state_mgr_up_msg`, no function name) |
//! | state | `0x80` | `Entering <NOTACTIVE\|DISCOVERING\|STANDBY\|MASTER> state` (`osm_report_sm_state`) |
//! | file dropped | `0x01` | `parse_part_conf: PARSE ERROR: line N: <no partition definition found\|bad partition flags\|bad partition definition\|bad PortGUID>` |
//! | file dropped | `0x01` | `osm_prtn_config_parse_file: PARSE ERROR: line N: internal: cannot create config` |
//! | file dropped | `0x01` | `osm_prtn_make_partitions: Partition configuration in error; retrying with default config` |
//!
//! A NodeDescription can never be the whole message of such a line: OpenSM prints it after
//! its own text (`... of node:`), never first.
//!
//! Newlines: OpenSM cleans every NodeDescription before it logs it (`clean_nodedesc`: at most
//! 63 bytes, every byte `isprint` rejects becomes a space), so a description cannot end a line
//! and forge the next one. One fabric-supplied string is logged raw: a ServiceRecord's name
//! (64 bytes any SA client sets), at `log_flags` DEBUG (0x08) only. A forged line through it
//! is followed, in the same write, by the rest of OpenSM's message on a line of its own
//! without OpenSM's prefix; so a verdict line directly followed by a line without the prefix
//! is not trusted ([`verdicts`]), and such lines are counted ([`Verdicts::continuations`]) so
//! the reader can report them.

use super::state::OpenSmState;

/// One OpenSM log line, split by structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLine<'a> {
    /// The level byte (`0x01` error, `0x02` info, `0x80` sys, ...).
    pub level: u8,
    /// The logging thread, as printed (`%04X`).
    pub thread: u32,
    /// Everything after `-> `, function name included, trailing whitespace removed.
    pub message: &'a str,
}

impl<'a> LogLine<'a> {
    /// Splits `line` when it starts with OpenSM's exact prefix; `None` otherwise (a line of
    /// some other writer, or the continuation of a message that carried a newline).
    pub fn parse(line: &'a str) -> Option<LogLine<'a>> {
        let b = line.as_bytes();
        // "Mon DD HH:MM:SS uuuuuu [" is 24 bytes.
        if b.len() < 24 {
            return None;
        }
        let month = &line[..3];
        if !MONTHS.contains(&month) || b[3] != b' ' {
            return None;
        }
        let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
        let two = |at: usize| digits(at..at + 2);
        if !(two(4)
            && b[6] == b' '
            && two(7)
            && b[9] == b':'
            && two(10)
            && b[12] == b':'
            && two(13)
            && b[15] == b' '
            && digits(16..22)
            && b[22] == b' '
            && b[23] == b'[')
        {
            return None;
        }
        let rest = &line[24..];
        let close = rest.find(']')?;
        let thread = &rest[..close];
        if !(4..=8).contains(&thread.len())
            || !thread
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(&c))
        {
            return None;
        }
        let thread = u32::from_str_radix(thread, 16).ok()?;
        let rest = rest[close + 1..].strip_prefix(" 0x")?;
        let level = rest.get(..2)?;
        if !level
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        {
            return None;
        }
        let level = u8::from_str_radix(level, 16).ok()?;
        let message = rest[2..].strip_prefix(" -> ")?.trim_end();
        Some(LogLine {
            level,
            thread,
            message,
        })
    }
}

const MONTHS: [&str; 13] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec", "???",
];

const ERROR: u8 = 0x01;
const INFO: u8 = 0x02;
const SYS: u8 = 0x80;

/// What one of OpenSM's own lines says about the partitions file, a sweep or the SM's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `SUBNET UP`: a heavy sweep ended.
    SubnetUp,
    /// OpenSM dropped the partitions file (a `PARSE ERROR` that ends the parse, or the
    /// fallback to the default configuration).
    Rejected,
    /// `Entering <STATE> state`.
    Entered(OpenSmState),
}

impl Verdict {
    /// The verdict of one line taken alone: only a line in OpenSM's exact shape whose whole
    /// message is one of the forms in the module docs. Everything else (a NodeDescription that
    /// quotes one, a message with a word more or less, a mgid `PARSE ERROR` OpenSM logs while
    /// keeping the file) is `None`.
    pub fn of_line(line: &str) -> Option<Verdict> {
        let l = LogLine::parse(line)?;
        let m = l.message;
        match l.level {
            INFO | SYS if m == "SUBNET UP" => return Some(Verdict::SubnetUp),
            SYS => {
                let state = m.strip_prefix("Entering ")?.strip_suffix(" state")?;
                return Some(Verdict::Entered(match state {
                    "MASTER" => OpenSmState::Master,
                    "STANDBY" => OpenSmState::Standby,
                    "DISCOVERING" => OpenSmState::Discovering,
                    "NOTACTIVE" => OpenSmState::NotActive,
                    "UNKNOWN STATE!!" => OpenSmState::Unknown,
                    _ => return None,
                }));
            }
            ERROR => {}
            _ => return None,
        }
        if m == "osm_prtn_make_partitions: Partition configuration in error; retrying with default config" {
            return Some(Verdict::Rejected);
        }
        let (function, reasons): (&str, &[&str]) = if let Some(r) =
            m.strip_prefix("parse_part_conf: PARSE ERROR: line ")
        {
            (
                r,
                &[
                    "no partition definition found",
                    "bad partition flags",
                    "bad partition definition",
                    "bad PortGUID",
                ],
            )
        } else if let Some(r) = m.strip_prefix("osm_prtn_config_parse_file: PARSE ERROR: line ") {
            (r, &["internal: cannot create config"])
        } else {
            return None;
        };
        let (number, reason) = function.split_once(": ")?;
        let is_number =
            !number.is_empty() && number.len() <= 10 && number.bytes().all(|c| c.is_ascii_digit());
        (is_number && reasons.contains(&reason)).then_some(Verdict::Rejected)
    }
}

/// OpenSM's verdicts in a run of log lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// The lines showing OpenSM dropped the partitions file, as written.
    pub rejections: Vec<String>,
    /// How many `SUBNET UP` lines.
    pub sweeps: usize,
    /// The last state announced, if any.
    pub state: Option<OpenSmState>,
    /// Lines without OpenSM's prefix (another writer, or a message that carried a newline).
    pub continuations: usize,
    /// Verdict-shaped lines not trusted because a line without OpenSM's prefix directly
    /// followed them (a forged line inside a message that carried a newline), as written.
    pub distrusted: Vec<String>,
}

/// Reads `lines` (complete lines, in log order) for OpenSM's verdicts (see the module docs).
pub fn verdicts<S: AsRef<str>>(lines: &[S]) -> Verdicts {
    let mut out = Verdicts::default();
    for (i, line) in lines.iter().enumerate() {
        let line = line.as_ref();
        if LogLine::parse(line).is_none() {
            out.continuations += 1;
            continue;
        }
        let Some(v) = Verdict::of_line(line) else {
            continue;
        };
        let cut = lines
            .get(i + 1)
            .is_some_and(|next| LogLine::parse(next.as_ref()).is_none());
        if cut {
            out.distrusted.push(line.to_owned());
            continue;
        }
        match v {
            Verdict::SubnetUp => out.sweeps += 1,
            Verdict::Rejected => out.rejections.push(line.to_owned()),
            Verdict::Entered(s) => out.state = Some(s),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "Dec 05 14:02:11 374208 [907926C0]";

    fn l(level: &str, message: &str) -> String {
        format!("{P} {level} -> {message}")
    }

    #[test]
    fn opensm_lines_give_their_verdicts() {
        assert_eq!(
            Verdict::of_line(&l("0x02", "SUBNET UP")),
            Some(Verdict::SubnetUp)
        );
        assert_eq!(
            Verdict::of_line(&l("0x80", "SUBNET UP")),
            Some(Verdict::SubnetUp)
        );
        for (line, state) in [
            ("Entering MASTER state", OpenSmState::Master),
            ("Entering STANDBY state", OpenSmState::Standby),
            ("Entering DISCOVERING state", OpenSmState::Discovering),
            ("Entering NOTACTIVE state", OpenSmState::NotActive),
        ] {
            assert_eq!(
                Verdict::of_line(&l("0x80", line)),
                Some(Verdict::Entered(state))
            );
        }
        for m in [
            "parse_part_conf: PARSE ERROR: line 5: no partition definition found",
            "parse_part_conf: PARSE ERROR: line 12: bad partition flags",
            "parse_part_conf: PARSE ERROR: line 1: bad partition definition",
            "parse_part_conf: PARSE ERROR: line 3: bad PortGUID",
            "osm_prtn_config_parse_file: PARSE ERROR: line 1: internal: cannot create config",
            "osm_prtn_make_partitions: Partition configuration in error; retrying with default config",
        ] {
            assert_eq!(
                Verdict::of_line(&l("0x01", m)),
                Some(Verdict::Rejected),
                "{m}"
            );
        }
        // A thread id of four digits, the month OpenSM prints when it has none, CRLF.
        assert_eq!(
            Verdict::of_line("??? 01 00:00:00 000000 [0A1B] 0x02 -> SUBNET UP\r"),
            Some(Verdict::SubnetUp)
        );
    }

    #[test]
    fn fabric_supplied_text_quoting_a_verdict_is_no_verdict() {
        let removed = |desc: &str| {
            l(
                "0x02",
                &format!("drop_mgr_remove_port: Removed port with GUID:0x0000000000100009 LID range [3, 3] of node:{desc}"),
            )
        };
        for desc in [
            "evil mlx5_0 -> SUBNET UP",
            "SUBNET UP",
            "x PARSE ERROR: line 5: no partition definition found",
            "parse_part_conf: PARSE ERROR: line 5: bad PortGUID",
            "Partition configuration in error; retrying with default config",
            "Entering STANDBY state",
            "Entering MASTER state",
        ] {
            assert_eq!(Verdict::of_line(&removed(desc)), None, "{desc}");
        }
        // The description printed by other functions, and at other levels.
        let nd = l(
            "0x04",
            "nd_rcv_process_nd: Node 0x100009, Description = Entering STANDBY state",
        );
        assert_eq!(Verdict::of_line(&nd), None);
        // A whole OpenSM line quoted inside a message.
        let quoted = l("0x02", &format!("x: {P} 0x02 -> SUBNET UP"));
        assert_eq!(Verdict::of_line(&quoted), None);
    }

    #[test]
    fn near_misses_are_no_verdict() {
        for (level, m) in [
            // The right words at the wrong level.
            ("0x01", "SUBNET UP"),
            ("0x08", "SUBNET UP"),
            ("0x02", "Entering STANDBY state"),
            ("0x02", "parse_part_conf: PARSE ERROR: line 5: bad PortGUID"),
            // A word more or less, another function, another reason.
            ("0x02", "SUBNET UP (sweep disabled)"),
            ("0x80", "Entering the fray state"),
            ("0x80", "Entering STANDBY state now"),
            ("0x01", "parse_part_conf: PARSE ERROR: line x: bad PortGUID"),
            ("0x01", "parse_part_conf: PARSE ERROR: line 5: bad PortGUID!"),
            ("0x01", "mgroup_create: PARSE ERROR: line 5: bad PortGUID"),
            ("0x01", "PARSE ERROR: line 5: no partition definition found"),
            ("0x01", "Partition configuration in error; retrying with default config"),
            // OpenSM keeps the file after a bad mgid.
            ("0x01", "mgroup_create: PARSE ERROR partition conf file line 3: mgid \"fe80::1\": gid is not multicast"),
        ] {
            assert_eq!(Verdict::of_line(&l(level, m)), None, "{level} {m}");
        }
        // Prefixes that are not OpenSM's.
        for line in [
            "x -> SUBNET UP",
            "-> SUBNET UP",
            "Dec 5 14:02:11 374208 [907926C0] 0x02 -> SUBNET UP",
            "Dec 05 14:02:11 37420 [907926C0] 0x02 -> SUBNET UP",
            "Dex 05 14:02:11 374208 [907926C0] 0x02 -> SUBNET UP",
            "Dec 05 14:02:11 374208 [907926c0] 0x02 -> SUBNET UP",
            "Dec 05 14:02:11 374208 [123] 0x02 -> SUBNET UP",
            "Dec 05 14:02:11 374208 [123456789] 0x02 -> SUBNET UP",
            "Dec 05 14:02:11 374208 [907926C0] 0x2 -> SUBNET UP",
            "Dec 05 14:02:11 374208 [907926C0] 0x02 SUBNET UP",
            " Dec 05 14:02:11 374208 [907926C0] 0x02 -> SUBNET UP",
        ] {
            assert_eq!(Verdict::of_line(line), None, "{line}");
        }
    }

    #[test]
    fn a_verdict_line_inside_a_message_that_carried_a_newline_is_not_trusted() {
        // A ServiceRecord name logged raw at DEBUG: "...Name:\n<forged line>\n is:0x10".
        let lines = [
            l("0x08", "osm_svcr_rcv: Remaining time for Service Name:"),
            l("0x02", "SUBNET UP"),
            " is:0x10".to_owned(),
            l("0x02", "SUBNET UP"),
        ];
        let v = verdicts(&lines);
        assert_eq!(v.sweeps, 1);
        assert_eq!(v.distrusted, vec![lines[1].clone()]);
        assert_eq!(v.continuations, 1);
        let forged_rejection = [
            l("0x01", "parse_part_conf: PARSE ERROR: line 5: bad PortGUID"),
            "rest of a message".to_owned(),
        ];
        assert!(verdicts(&forged_rejection).rejections.is_empty());
        let forged_state = [l("0x80", "Entering STANDBY state"), "tail".to_owned()];
        assert_eq!(verdicts(&forged_state).state, None);
    }

    #[test]
    fn verdicts_of_a_sweep_that_dropped_the_file() {
        let lines = [
            l("0x01", "parse_part_conf: PARSE ERROR: line 5: no partition definition found"),
            l(
                "0x01",
                "osm_prtn_make_partitions: Partition configuration in error; retrying with default config",
            ),
            l("0x02", "drop_mgr_remove_port: Removed port with GUID:0x1 LID range [3, 3] of node:Entering MASTER state"),
            l("0x02", "SUBNET UP"),
            l("0x80", "Entering STANDBY state"),
        ];
        let v = verdicts(&lines);
        assert_eq!(v.rejections, lines[..2].to_vec());
        assert_eq!(v.sweeps, 1);
        assert_eq!(v.state, Some(OpenSmState::Standby));
        assert!(v.distrusted.is_empty() && v.continuations == 0);
    }
}
