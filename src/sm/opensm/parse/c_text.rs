//! C's string functions as OpenSM's partitions reader uses them (`strtoul` with base 0,
//! `isspace`, `strncmp` prefixes), byte for byte, so the reader can mirror the C code.

/// A number as C's `strtoul(s, &end, 0)` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CNumber {
    /// The `unsigned long` result.
    pub value: u64,
    /// Bytes consumed (0 when there were no digits).
    pub used: usize,
    /// A leading `-` (the result is the negation, modulo 2^64).
    pub negative: bool,
    /// The digits overflowed (the result is `ULONG_MAX`).
    pub overflow: bool,
    /// Read as hexadecimal (`0x` prefix).
    pub hex: bool,
}

/// C's `isspace` in the "C" locale.
pub(super) fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// C's `strtoul` with base 0: optional white space and sign, then `0x` hex, `0` octal or decimal.
pub(super) fn c_strtoul(s: &[u8]) -> CNumber {
    let at = |i: usize| s.get(i).copied().unwrap_or(0);
    let mut i = 0;
    while is_c_space(at(i)) {
        i += 1;
    }
    let mut negative = false;
    if at(i) == b'+' || at(i) == b'-' {
        negative = at(i) == b'-';
        i += 1;
    }
    let (radix, hex) =
        if at(i) == b'0' && matches!(at(i + 1), b'x' | b'X') && at(i + 2).is_ascii_hexdigit() {
            i += 2;
            (16, true)
        } else if at(i) == b'0' {
            (8, false)
        } else {
            (10, false)
        };
    let start = i;
    let mut value: u64 = 0;
    let mut overflow = false;
    while let Some(d) = (at(i) as char).to_digit(radix) {
        match value
            .checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start {
        return CNumber {
            value: 0,
            used: 0,
            negative: false,
            overflow: false,
            hex: false,
        };
    }
    let value = if overflow {
        u64::MAX
    } else if negative {
        value.wrapping_neg()
    } else {
        value
    };
    CNumber {
        value,
        used: i,
        negative,
        overflow,
        hex,
    }
}

/// `strncmp(word, keyword, strlen(word)) == 0`: the word is a (possibly empty) prefix.
pub(super) fn is_prefix(word: &[u8], keyword: &str) -> bool {
    word.len() <= keyword.len() && keyword.as_bytes().starts_with(word)
}

/// The bytes as text, invalid UTF-8 replaced (for messages).
pub(super) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
