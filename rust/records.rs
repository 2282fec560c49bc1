//! Export records (JSON Lines) parsed into columns, the import's fast path (`parse_lines`), and
//! written from columns, the export's (`export_lines`).
//!
//! Reading:
//! A line is taken only when it is a JSON object whose every member is a known field with a
//! value of the field's JSON type, in the plain form an export writes (vectors as unpadded or
//! padded base64 of one width, cluster pairs as `[int, number]`). The first line that is not
//! stops the parse there; the Python side reads it and the rest by the general path, which
//! decides and words any error. So what this module takes it reads exactly as `json.loads`
//! would, and what it does not take is never refused here. Checks of the values themselves
//! (blank strings, key lengths, finite non-zero vectors...) stay in Python, on the columns.

/// How a field's value is read: the JSON types it may hold (besides `null`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Str,
    /// An integer >= 0 (fits i64).
    Count,
    /// A number (finite), read as a double.
    Float,
    /// `true` or `false`.
    Bool,
    /// An object, kept as its JSON text.
    Object,
    /// Base64 of little-endian float32 values, one width for every line.
    Vector,
    /// `[[cluster id, affinity], ...]`.
    Pairs,
}

/// One field's value in one line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Null,
    /// Text bytes (valid UTF-8): `input[start..end]` when `copied` is false, else `text[start..end]`.
    Str { start: usize, end: usize, copied: bool },
    Int(i64),
    Float(f64),
    Bool(bool),
    /// An object's JSON text, `input[start..end]`; `canonical`: it is the text Python's
    /// `json.dumps(value, ensure_ascii=False)` makes of the value it reads as.
    Object { start: usize, end: usize, canonical: bool },
}

/// The lines parsed: `values[field][line]`, the vectors row by row (`dim` wide; zero rows are
/// never written: a line without a vector is not taken), the pairs (`pair_counts[line]`: -1
/// for null or absent, else how many of `pair_ids` / `pair_aff` are its, in order).
#[derive(Debug, Default)]
pub struct Parsed {
    pub lines: usize,
    pub values: Vec<Vec<Value>>,
    pub text: Vec<u8>,
    pub vectors: Vec<f32>,
    pub dim: usize,
    pub pair_counts: Vec<i32>,
    pub pair_ids: Vec<i64>,
    pub pair_aff: Vec<f32>,
    /// Bytes of the input read, whole lines (their newlines included).
    pub consumed: usize,
    /// A line this module does not take starts at `consumed` (else the input, or
    /// `max_lines`, ended).
    pub stopped: bool,
}

/// Ids of clusters above this are left to the general path (it reads pairs through doubles).
const MAX_PAIR_ID: i64 = 1 << 53;
/// Nesting depth of metadata beyond which the line is left to the general path.
const MAX_DEPTH: usize = 64;

/// Parse up to `max_lines` lines of `input` from its start. `names[i]` / `kinds[i]`: the
/// fields; `dim`: the vectors' width (None: the first vector's).
pub fn parse_lines(input: &[u8], names: &[&[u8]], kinds: &[Kind], dim: Option<usize>, max_lines: usize) -> Parsed {
    let mut out = Parsed { values: vec![Vec::new(); names.len()], dim: dim.unwrap_or(0), ..Parsed::default() };
    let mut width = dim;
    let mut pos = 0;
    while pos < input.len() && out.lines < max_lines {
        let end = memchr::memchr(b'\n', &input[pos..]).map_or(input.len(), |i| pos + i);
        let mut line = Line::new(&input[..end], pos, &mut out.text);
        let mut row = vec![Value::Null; names.len()];
        let mut vector: Option<(usize, usize)> = None;
        let mut pairs: Option<(usize, usize)> = None;
        let ok = line.object(names, kinds, width, &mut row, &mut vector, &mut pairs);
        let ok = ok
            && match vector {
                None => false,
                Some((s, e)) => push_vector(&input[s..e], &mut width, &mut out.vectors),
            };
        let before = (out.pair_ids.len(), out.pair_aff.len());
        let ok = ok
            && match pairs {
                None => {
                    out.pair_counts.push(-1);
                    true
                }
                Some((s, e)) => push_pairs(&input[s..e], &mut out),
            };
        if !ok {
            // Undo this line's partial writes: the columns hold whole lines only.
            if let Some(w) = width {
                out.vectors.truncate(out.lines * w);
            }
            out.pair_ids.truncate(before.0);
            out.pair_aff.truncate(before.1);
            out.pair_counts.truncate(out.lines);
            if out.lines == 0 {
                width = dim;
            }
            out.stopped = true;
            break;
        }
        for (col, v) in out.values.iter_mut().zip(row) {
            col.push(v);
        }
        out.lines += 1;
        pos = (end + 1).min(input.len());
        out.consumed = pos;
    }
    out.dim = width.unwrap_or(0);
    out
}

/// Step `at` past `word` when `buf` holds it there.
fn take(buf: &[u8], at: &mut usize, word: &[u8]) -> bool {
    let found = buf[*at..].starts_with(word);
    if found {
        *at += word.len();
    }
    found
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r')
}

/// A cursor over one line (`buf[at..]`); copied string text goes to `text`.
struct Line<'a> {
    buf: &'a [u8],
    at: usize,
    text: &'a mut Vec<u8>,
}

impl<'a> Line<'a> {
    fn new(buf: &'a [u8], at: usize, text: &'a mut Vec<u8>) -> Self {
        Line { buf, at, text }
    }

    fn peek(&self) -> Option<u8> {
        self.buf.get(self.at).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.peek() == Some(b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        take(self.buf, &mut self.at, word)
    }

    /// The whole line as one object of known fields, each once; nothing after it but spaces.
    fn object(&mut self, names: &[&[u8]], kinds: &[Kind], width: Option<usize>, row: &mut [Value],
              vector: &mut Option<(usize, usize)>, pairs: &mut Option<(usize, usize)>) -> bool {
        if !self.eat(b'{') {
            return false;
        }
        let mut seen = vec![false; names.len()];
        if !self.eat(b'}') {
            loop {
                self.ws();
                let Some((ks, ke)) = self.plain_string() else { return false };
                let key = &self.buf[ks..ke];
                // Lines of an export name the fields in order: the next one is tried first.
                let next = seen.iter().filter(|&&s| s).count();
                let f = if names.get(next) == Some(&key) {
                    next
                } else {
                    let Some(f) = names.iter().position(|n| *n == key) else { return false };
                    f
                };
                if seen[f] || !self.eat(b':') {
                    return false;
                }
                seen[f] = true;
                self.ws();
                if self.literal(b"null") {
                    row[f] = Value::Null;
                } else {
                    let ok = match kinds[f] {
                        Kind::Str => self.string().map(|v| row[f] = v).is_some(),
                        Kind::Count => self.count().map(|v| row[f] = Value::Int(v)).is_some(),
                        Kind::Float => self.float().map(|v| row[f] = Value::Float(v)).is_some(),
                        Kind::Bool => {
                            if self.literal(b"true") {
                                row[f] = Value::Bool(true);
                                true
                            } else if self.literal(b"false") {
                                row[f] = Value::Bool(false);
                                true
                            } else {
                                false
                            }
                        }
                        Kind::Object => {
                            let start = self.at;
                            let ok = self.peek() == Some(b'{') && self.skip_value(0);
                            ok && std::str::from_utf8(&self.buf[start..self.at]).is_ok() && {
                                let canonical = canonical(&self.buf[start..self.at]);
                                row[f] = Value::Object { start, end: self.at, canonical };
                                true
                            }
                        }
                        Kind::Vector => self.vector(width).map(|r| *vector = Some(r)).is_some(),
                        Kind::Pairs => {
                            let start = self.at;
                            self.peek() == Some(b'[') && self.skip_value(0) && {
                                *pairs = Some((start, self.at));
                                true
                            }
                        }
                    };
                    if !ok {
                        return false;
                    }
                }
                if self.eat(b',') {
                    continue;
                }
                if self.eat(b'}') {
                    break;
                }
                return false;
            }
        }
        self.ws();
        self.at == self.buf.len()
    }

    /// A vector's base64 text: its range. Once the width is known the closing quote is
    /// looked for where that width puts it (the decoder refuses any other character).
    fn vector(&mut self, width: Option<usize>) -> Option<(usize, usize)> {
        let Some(w) = width else { return self.plain_string() };
        let end = self.at + 1 + b64_len(w * 4);
        if self.peek() != Some(b'"') || self.buf.get(end) != Some(&b'"') {
            return None;
        }
        let start = self.at + 1;
        self.at = end + 1;
        Some((start, end))
    }

    /// A string without escapes or control characters: its content's range.
    fn plain_string(&mut self) -> Option<(usize, usize)> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.at + 1;
        let len = self.buf[start..].iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if self.buf[start + len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        Some((start, start + len))
    }

    /// A string value: as it stands when it has no escape, else unescaped into `text`.
    /// Escapes that make a lone surrogate are not taken (`json.loads` keeps them in a str).
    fn string(&mut self) -> Option<Value> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.at + 1;
        let mut i = start;
        while i < self.buf.len() && self.buf[i] != b'"' && self.buf[i] != b'\\' && self.buf[i] >= 0x20 {
            i += 1;
        }
        if i >= self.buf.len() || self.buf[i] < 0x20 {
            return None;
        }
        if self.buf[i] == b'"' {
            std::str::from_utf8(&self.buf[start..i]).ok()?;
            self.at = i + 1;
            return Some(Value::Str { start, end: i, copied: false });
        }
        let from = self.text.len();
        self.text.extend_from_slice(&self.buf[start..i]);
        loop {
            match *self.buf.get(i)? {
                b'"' => break,
                b'\\' => {
                    let c = *self.buf.get(i + 1)?;
                    i += 2;
                    let ch = match c {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = hex4(self.buf.get(i..i + 4)?)?;
                            i += 4;
                            if (0xD800..0xDC00).contains(&hi) {
                                if self.buf.get(i..i + 2)? != b"\\u" {
                                    return None;
                                }
                                let lo = hex4(self.buf.get(i + 2..i + 6)?)?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return None;
                                }
                                i += 6;
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                            } else {
                                char::from_u32(hi)? // None for a lone low surrogate
                            }
                        }
                        _ => return None,
                    };
                    let mut b = [0u8; 4];
                    self.text.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                b if b < 0x20 => return None,
                _ => {
                    let run = self.buf[i..].iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
                    self.text.extend_from_slice(&self.buf[i..i + run]);
                    i += run;
                }
            }
        }
        std::str::from_utf8(&self.text[from..]).ok()?;
        self.at = i + 1;
        Some(Value::Str { start: from, end: self.text.len(), copied: true })
    }

    /// A number token (JSON grammar): its range and whether it is an integer (no fraction,
    /// no exponent).
    fn number(&mut self) -> Option<(usize, usize, bool)> {
        let start = self.at;
        let b = self.buf;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(c) if c.is_ascii_digit() => i = digits_end(b, i),
            _ => return None,
        }
        let mut int = true;
        if b.get(i) == Some(&b'.') {
            int = false;
            let d = i + 1;
            i = digits_end(b, d);
            if i == d {
                return None;
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            int = false;
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let d = i;
            i = digits_end(b, d);
            if i == d {
                return None;
            }
        }
        self.at = i;
        Some((start, i, int))
    }

    /// An integer >= 0 that fits i64.
    fn count(&mut self) -> Option<i64> {
        let (s, e, int) = self.number()?;
        if !int {
            return None;
        }
        let v: i64 = std::str::from_utf8(&self.buf[s..e]).ok()?.parse().ok()?;
        (v >= 0).then_some(v)
    }

    /// A finite number as Python reads it: an integer token is an int (so "-0" is 0), made a
    /// double by correct rounding; others are correctly rounded doubles.
    fn float(&mut self) -> Option<f64> {
        let (s, e, int) = self.number()?;
        let text = std::str::from_utf8(&self.buf[s..e]).ok()?;
        let v: f64 = if int {
            match text.parse::<i64>() {
                Ok(i) => i as f64,
                Err(_) => text.parse::<f64>().ok()?,
            }
        } else {
            text.parse().ok()?
        };
        let v = if int && v == 0.0 { 0.0 } else { v };
        v.is_finite().then_some(v)
    }

    /// Any JSON value (strings checked for escapes and UTF-8 by the caller's slice check).
    fn skip_value(&mut self, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        self.ws();
        match self.peek() {
            Some(b'{') => {
                self.at += 1;
                if self.eat(b'}') {
                    return true;
                }
                loop {
                    self.ws();
                    if self.string().is_none() || !self.eat(b':') || !self.skip_value(depth + 1) {
                        return false;
                    }
                    if self.eat(b',') {
                        continue;
                    }
                    return self.eat(b'}');
                }
            }
            Some(b'[') => {
                self.at += 1;
                if self.eat(b']') {
                    return true;
                }
                loop {
                    if !self.skip_value(depth + 1) {
                        return false;
                    }
                    if self.eat(b',') {
                        continue;
                    }
                    return self.eat(b']');
                }
            }
            Some(b'"') => {
                // Unescaped into `text` and dropped: only its validity matters here.
                let mark = self.text.len();
                let ok = self.string().is_some();
                self.text.truncate(mark);
                ok
            }
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => self.number().is_some(),
        }
    }
}

/// Whether `json` is one JSON object, whitespace around it allowed, by the grammar the line
/// reader takes (no NaN or Infinity, no lone surrogate, at most `MAX_DEPTH` deep). A text it
/// refuses may still be one `json.loads` reads: the caller asks Python about those.
pub fn is_object(json: &[u8], scratch: &mut Vec<u8>) -> bool {
    scratch.clear();
    let mut line = Line::new(json, 0, scratch);
    line.ws();
    if line.peek() != Some(b'{') || !line.skip_value(0) {
        return false;
    }
    line.ws();
    line.at == json.len()
}

/// Whether `json` (valid JSON, as `Line::skip_value` took it) is exactly the text Python's
/// `json.dumps(value, ensure_ascii=False)` writes for the value `json.loads` reads from it:
/// ", " and ": " separators and no other space, each key once, strings escaped as
/// `json.encoder.encode_basestring` escapes them, numbers as `int` / `float.__repr__` write
/// them. Such text is stored as it stands; any other is rewritten in that form.
pub fn canonical(json: &[u8]) -> bool {
    let mut c = Canon { b: json, at: 0 };
    c.value() && c.at == json.len()
}

struct Canon<'a> {
    b: &'a [u8],
    at: usize,
}

impl Canon<'_> {
    fn next_is(&mut self, text: &[u8]) -> bool {
        take(self.b, &mut self.at, text)
    }

    fn value(&mut self) -> bool {
        match self.b.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                if self.next_is(b"}") {
                    return true;
                }
                let mut keys: Vec<&[u8]> = Vec::new();
                loop {
                    let start = self.at;
                    if !self.string() {
                        return false;
                    }
                    let key = &self.b[start..self.at];
                    if keys.contains(&key) {
                        return false;
                    }
                    keys.push(key);
                    if !self.next_is(b": ") || !self.value() {
                        return false;
                    }
                    if self.next_is(b"}") {
                        return true;
                    }
                    if !self.next_is(b", ") {
                        return false;
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                if self.next_is(b"]") {
                    return true;
                }
                loop {
                    if !self.value() {
                        return false;
                    }
                    if self.next_is(b"]") {
                        return true;
                    }
                    if !self.next_is(b", ") {
                        return false;
                    }
                }
            }
            Some(b'"') => self.string(),
            Some(b't') => self.next_is(b"true"),
            Some(b'f') => self.next_is(b"false"),
            Some(b'n') => self.next_is(b"null"),
            _ => self.number(),
        }
    }

    /// A string escaped as `encode_basestring` escapes: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`,
    /// `\f`, other control characters as lowercase `\u00xx`, nothing else.
    fn string(&mut self) -> bool {
        if !self.next_is(b"\"") {
            return false;
        }
        loop {
            match self.b.get(self.at) {
                None => return false,
                Some(b'"') => {
                    self.at += 1;
                    return true;
                }
                Some(b'\\') => {
                    let ok = match self.b.get(self.at + 1) {
                        Some(b'"' | b'\\' | b'n' | b'r' | b't' | b'b' | b'f') => {
                            self.at += 2;
                            true
                        }
                        Some(b'u') => {
                            let h = self.b.get(self.at + 2..self.at + 6).unwrap_or(b"");
                            let ok = h.len() == 4
                                && h.starts_with(b"00")
                                && h.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
                                && hex4(h).is_some_and(|c| c < 0x20 && !matches!(c, 0x8 | 0x9 | 0xA | 0xC | 0xD));
                            self.at += 6;
                            ok
                        }
                        _ => false,
                    };
                    if !ok {
                        return false;
                    }
                }
                Some(_) => self.at += 1,
            }
        }
    }

    fn number(&mut self) -> bool {
        let start = self.at;
        while self.b.get(self.at).is_some_and(|c| matches!(c, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')) {
            self.at += 1;
        }
        let token = &self.b[start..self.at];
        if token.is_empty() {
            return false;
        }
        if token.iter().all(|c| c.is_ascii_digit() || *c == b'-') {
            return token != b"-0";
        }
        let Some(x) = std::str::from_utf8(token).ok().and_then(|t| t.parse::<f64>().ok()) else { return false };
        x.is_finite() && python_repr(x).as_bytes() == token
    }
}

/// `float.__repr__` of a finite double: the shortest digits that read back to it, fixed
/// notation for exponents -4..16 (".0" after a whole number), else "d.ddde+XX".
pub fn python_repr(x: f64) -> String {
    let e = format!("{x:e}"); // shortest round-trip digits: "-1.25e-7", "1e16", "0e0"
    let (mant, exp) = e.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("exponent");
    let neg = mant.starts_with('-');
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let whole = exp as usize + 1;
            if digits.len() <= whole {
                format!("{digits}{}.0", "0".repeat(whole - digits.len()))
            } else {
                format!("{}.{}", &digits[..whole], &digits[whole..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let m = if digits.len() == 1 { digits.clone() } else { format!("{}.{}", &digits[..1], &digits[1..]) };
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    };
    if neg {
        format!("-{body}")
    } else {
        body
    }
}

fn hex4(h: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(h).ok()?;
    if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

const fn b64_table() -> [u8; 256] {
    let mut t = [255u8; 256];
    let alphabet = B64_ALPHABET;
    let mut i = 0;
    while i < 64 {
        t[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    t
}

/// Each base64 character's value shifted to its place in a 24-bit group (character `k` of 4 at
/// `18 - 6k`) and a bad character as bit 31: a group is four lookups OR-ed, and one test of
/// the OR of every group finds any bad character. 0.73-0.84 us per 384-float vector against
/// 1.0-1.1 us for a lookup, test and shift per character (BENCHMARKS.md, "Export and import").
const fn b64_shifted(shift: u32) -> [u32; 256] {
    let t = b64_table();
    let mut out = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        out[i] = if t[i] == 255 { 1 << 31 } else { (t[i] as u32) << shift };
        i += 1;
    }
    out
}

static B64_AT: [[u32; 256]; 4] = [b64_shifted(18), b64_shifted(12), b64_shifted(6), b64_shifted(0)];

/// One 4-character group: its 24 bits, or bit 31 set for a bad character.
#[inline(always)]
fn b64_group(c: &[u8]) -> u32 {
    B64_AT[0][c[0] as usize] | B64_AT[1][c[1] as usize] | B64_AT[2][c[2] as usize] | B64_AT[3][c[3] as usize]
}

/// Length of the base64 text of `bytes` bytes (padded).
fn b64_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

/// Strict base64 (no whitespace, padding only to complete the last group, zero bits after
/// the last byte) decoded into `out`, which must be exactly the decoded length.
fn b64_decode(text: &[u8], out: &mut [u8]) -> bool {
    if text.is_empty() || !text.len().is_multiple_of(4) {
        return false;
    }
    let pad = text.iter().rev().take(2).take_while(|&&c| c == b'=').count();
    let body = &text[..text.len() - pad];
    if body.len() / 4 * 3 + [0, 0, 1, 2][body.len() % 4] != out.len() {
        return false;
    }
    let mut bad = 0u32;
    let mut chunks = body.chunks_exact(4);
    let mut dst = out.chunks_exact_mut(3);
    for (c, o) in (&mut chunks).zip(&mut dst) {
        let v = b64_group(c);
        bad |= v;
        o[0] = (v >> 16) as u8;
        o[1] = (v >> 8) as u8;
        o[2] = v as u8;
    }
    if bad >> 31 != 0 {
        return false;
    }
    let rest = chunks.remainder();
    let tail = dst.into_remainder();
    let mut acc = 0u32;
    for &c in rest {
        let x = B64_AT[3][c as usize]; // shifted by 0: the value itself
        if x >> 31 != 0 {
            return false;
        }
        acc = acc << 6 | x;
    }
    match rest.len() {
        0 => true,
        2 if acc & 0xF == 0 => {
            tail[0] = (acc >> 4) as u8;
            true
        }
        3 if acc & 0x3 == 0 => {
            tail[0] = (acc >> 10) as u8;
            tail[1] = (acc >> 2) as u8;
            true
        }
        _ => false,
    }
}

/// One line's vector (base64 from `text`) appended to `vectors`; its width is fixed by the
/// first one (`width`).
fn push_vector(text: &[u8], width: &mut Option<usize>, vectors: &mut Vec<f32>) -> bool {
    let n = match *width {
        Some(w) => w,
        None => {
            // The first vector: its width from its length (whole float32 values only).
            let pad = text.iter().rev().take(2).take_while(|&&c| c == b'=').count();
            let bytes = (text.len() / 4 * 3).saturating_sub(pad);
            if !text.len().is_multiple_of(4) || bytes == 0 || !bytes.is_multiple_of(4) {
                return false;
            }
            bytes / 4
        }
    };
    let at = vectors.len();
    vectors.resize(at + n, 0.0);
    // SAFETY: any bytes are a valid f32; the slice covers exactly the n new values.
    let raw = unsafe { std::slice::from_raw_parts_mut(vectors[at..].as_mut_ptr() as *mut u8, n * 4) };
    if !b64_decode(text, raw) {
        vectors.truncate(at);
        return false;
    }
    if cfg!(target_endian = "big") {
        for v in &mut vectors[at..] {
            *v = f32::from_bits(v.to_bits().swap_bytes());
        }
    }
    *width = Some(n);
    true
}

/// One line's pairs (`[[id, affinity], ...]`, ids >= 0, finite affinities) appended.
fn push_pairs(text: &[u8], out: &mut Parsed) -> bool {
    let mut scratch = Vec::new();
    let mut l = Line::new(text, 0, &mut scratch);
    if !l.eat(b'[') {
        return false;
    }
    let mut count = 0;
    if !l.eat(b']') {
        loop {
            if !l.eat(b'[') {
                return false;
            }
            l.ws();
            let Some(id) = l.count() else { return false };
            if id > MAX_PAIR_ID || !l.eat(b',') {
                return false;
            }
            l.ws();
            let Some(a) = l.float() else { return false };
            if !l.eat(b']') {
                return false;
            }
            out.pair_ids.push(id);
            out.pair_aff.push(a as f32);
            count += 1;
            if l.eat(b',') {
                continue;
            }
            if l.eat(b']') {
                break;
            }
            return false;
        }
    }
    out.pair_counts.push(count);
    true
}

/// Export lines, appended to `out`: per line `{"name":text,...,"vector":"<base64>","clusters":[[id,affinity],...]}`
/// and a newline. `texts[field][line]`: each field's value as JSON text; `vectors`: the lines'
/// vectors row by row (`dim` wide, base64 of their float32 little-endian bytes); `pair_ids` /
/// `pair_aff`: `k` pairs per line, best first, those with an id < 0 left out, affinities
/// written with nine significant digits (`%.9g`), which name each float32 exactly.
#[allow(clippy::too_many_arguments)]
pub fn export_lines(names: &[&[u8]], texts: &[Vec<&[u8]>], vectors: &[f32], dim: usize, pair_ids: &[i64],
                    pair_aff: &[f32], k: usize, out: &mut Vec<u8>) {
    let lines = vectors.len().checked_div(dim).unwrap_or_else(|| texts.first().map_or(0, Vec::len));
    let per_line: usize = names.iter().map(|n| n.len() + 4).sum::<usize>() + b64_len(dim * 4) + 32 + 32 * k;
    out.reserve(lines * per_line + texts.iter().flatten().map(|t| t.len()).sum::<usize>());
    let mut raw = vec![0u8; dim * 4];
    for line in 0..lines {
        out.push(b'{');
        for (f, name) in names.iter().enumerate() {
            if f > 0 {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(name);
            out.extend_from_slice(b"\":");
            out.extend_from_slice(texts[f][line]);
        }
        out.extend_from_slice(b",\"vector\":\"");
        for (b, v) in raw.chunks_exact_mut(4).zip(&vectors[line * dim..(line + 1) * dim]) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        b64_encode(&raw, out);
        out.extend_from_slice(b"\",\"clusters\":[");
        let mut first = true;
        for j in 0..k {
            let id = pair_ids[line * k + j];
            if id < 0 {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            out.push(b'[');
            out.extend_from_slice(id.to_string().as_bytes());
            out.push(b',');
            g9(pair_aff[line * k + j] as f64, out);
            out.push(b']');
        }
        out.extend_from_slice(b"]}\n");
    }
}

/// C's `%.9g` of a finite double: nine significant digits, fixed notation for exponents
/// -4..9, else `d.ddde+XX`, trailing zeros dropped. A value halfway between two nine-digit
/// decimals may round the other way than C's printf; either reads back to the same float32.
pub fn g9(x: f64, out: &mut Vec<u8>) {
    if x == 0.0 {
        out.extend_from_slice(if x.is_sign_negative() { b"-0" } else { b"0" });
        return;
    }
    let e = format!("{x:.8e}"); // nine digits, correctly rounded: "-1.23456789e-5"
    let (mant, exp) = e.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("exponent");
    if mant.starts_with('-') {
        out.push(b'-');
    }
    let digits: Vec<u8> = mant.bytes().filter(u8::is_ascii_digit).collect();
    if !(-4..9).contains(&exp) {
        let d = &digits[..digits.iter().rposition(|&c| c != b'0').map_or(1, |i| i + 1)];
        out.push(d[0]);
        if d.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&d[1..]);
        }
        out.extend_from_slice(format!("e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs()).as_bytes());
        return;
    }
    let (whole, frac): (Vec<u8>, Vec<u8>) = if exp >= 0 {
        let w = exp as usize + 1;
        (digits[..w].to_vec(), digits[w..].to_vec())
    } else {
        (b"0".to_vec(), [vec![b'0'; (-exp - 1) as usize], digits].concat())
    };
    out.extend_from_slice(&whole);
    let keep = frac.iter().rposition(|&c| c != b'0').map_or(0, |i| i + 1);
    if keep > 0 {
        out.push(b'.');
        out.extend_from_slice(&frac[..keep]);
    }
}

const B64_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, appended to `out`.
fn b64_encode(data: &[u8], out: &mut Vec<u8>) {
    let mut chunks = data.chunks_exact(3);
    for c in &mut chunks {
        let v = (c[0] as u32) << 16 | (c[1] as u32) << 8 | c[2] as u32;
        out.extend_from_slice(&[
            B64_ALPHABET[(v >> 18) as usize & 63],
            B64_ALPHABET[(v >> 12) as usize & 63],
            B64_ALPHABET[(v >> 6) as usize & 63],
            B64_ALPHABET[v as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let v = (a as u32) << 16;
            out.extend_from_slice(&[B64_ALPHABET[(v >> 18) as usize & 63], B64_ALPHABET[(v >> 12) as usize & 63], b'=', b'=']);
        }
        [a, b] => {
            let v = (a as u32) << 16 | (b as u32) << 8;
            out.extend_from_slice(&[
                B64_ALPHABET[(v >> 18) as usize & 63],
                B64_ALPHABET[(v >> 12) as usize & 63],
                B64_ALPHABET[(v >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
}

/// The end of the run of ASCII digits in `b` that starts at `i` (`i` when there is none).
fn digits_end(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&[u8]; 6] = [b"id", b"text", b"metadata", b"created_at", b"vector", b"clusters"];
    const KINDS: [Kind; 6] = [Kind::Count, Kind::Str, Kind::Object, Kind::Float, Kind::Vector, Kind::Pairs];

    fn parse(input: &str) -> Parsed {
        parse_lines(input.as_bytes(), &NAMES, &KINDS, None, usize::MAX)
    }

    #[test]
    fn base64_decodes_what_it_encodes_and_nothing_else() {
        // Every length from 1 to 40 bytes covers whole groups, each remainder and each padding.
        for n in 1..=40usize {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            let mut text = Vec::new();
            b64_encode(&data, &mut text);
            let mut out = vec![0u8; n];
            assert!(b64_decode(&text, &mut out), "length {n}");
            assert_eq!(out, data, "length {n}");
            // One bad character anywhere before the padding is refused.
            let body = text.len() - text.iter().rev().take_while(|&&c| c == b'=').count();
            for at in 0..body {
                let mut bad = text.clone();
                bad[at] = b'*';
                assert!(!b64_decode(&bad, &mut vec![0u8; n]), "length {n}, bad character at {at}");
            }
            // The wrong decoded length is refused.
            assert!(!b64_decode(&text, &mut vec![0u8; n + 1]), "length {n}");
        }
        // Bits after the last byte must be zero: "AB==" holds one byte with 4 bits left over.
        assert!(!b64_decode(b"AB==", &mut [0u8; 1]));
        assert!(b64_decode(b"AA==", &mut [0u8; 1]));
    }

    #[test]
    fn export_lines_become_columns() {
        // 1.0f32, 2.0f32 little endian: "AACAPwAAAEA="
        let p = parse("{\"id\":3,\"text\":\"a\\n\\u00e9\\ud83d\\ude00\",\"metadata\":{\"k\": [1, \"x\"]},\"created_at\":-0,\"vector\":\"AACAPwAAAEA=\",\"clusters\":[[4,0.5],[7,1]]}\n{\"text\":\"b\",\"vector\":\"AACAPwAAAEA=\"}\n");
        assert_eq!((p.lines, p.dim, p.stopped), (2, 2, false));
        assert_eq!(p.values[0], vec![Value::Int(3), Value::Null]);
        let Value::Str { start, end, copied: true } = p.values[1][0] else { panic!() };
        assert_eq!(std::str::from_utf8(&p.text[start..end]).unwrap(), "a\n\u{e9}\u{1F600}");
        assert_eq!(p.values[3][0], Value::Float(0.0));
        assert!(p.values[3][0] == Value::Float(0.0) && matches!(p.values[3][0], Value::Float(x) if x.is_sign_positive()));
        assert_eq!(p.vectors, vec![1.0, 2.0, 1.0, 2.0]);
        assert_eq!((p.pair_counts, p.pair_ids, p.pair_aff), (vec![2, -1], vec![4, 7], vec![0.5, 1.0]));
    }

    #[test]
    fn stops_at_a_line_it_does_not_take() {
        for bad in ["{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\",\"x\":1}", // unknown field
                    "{\"text\":\"a\",\"text\":\"b\",\"vector\":\"AACAPwAAAEA=\"}", // twice
                    "{\"text\":1,\"vector\":\"AACAPwAAAEA=\"}", // wrong type
                    "{\"text\":\"\\ud800\",\"vector\":\"AACAPwAAAEA=\"}", // lone surrogate
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA\"}", // base64 length
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEB=\"}", // bits after the last byte
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\",\"id\":-1}", // negative id
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\",\"created_at\":1e999}", // not finite
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\",\"clusters\":[[1.0,1]]}", // float id
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\",\"metadata\":[1]}", // not an object
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\",\"metadata\":{\"a\":NaN}}",
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\"} x", // trailing text
                    "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\"", // cut
                    "", // blank
                    "{\"text\":\"a\"}", // no vector
                    "{\"text\":\"a\",\"vector\":\"AACAPw==\"}"] // another width
        {
            let input = format!("{{\"text\":\"ok\",\"vector\":\"AACAPwAAAEA=\",\"clusters\":[[1,0.5]]}}\n{bad}\n");
            let p = parse(&input);
            assert_eq!((p.lines, p.stopped), (1, true), "{bad}");
            assert_eq!(p.consumed, input.find('\n').unwrap() + 1);
            assert_eq!((p.vectors.len(), p.pair_counts.len(), p.pair_ids.len()), (2, 1, 1), "{bad}");
        }
    }

    #[test]
    fn export_lines_read_back() {
        let names: [&[u8]; 2] = [b"id", b"text"];
        let texts = vec![vec![&b"1"[..], b"2"], vec![&b"\"a\""[..], b"null"]];
        let mut out = Vec::new();
        export_lines(&names, &texts, &[1.0, 2.0, 3.0, 4.0], 2, &[4, -1, -1, -1], &[0.5, 0.0, 0.0, 0.0], 2, &mut out);
        assert_eq!(std::str::from_utf8(&out).unwrap(),
                   "{\"id\":1,\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\",\"clusters\":[[4,0.5]]}\n\
                    {\"id\":2,\"text\":null,\"vector\":\"AABAQAAAgEA=\",\"clusters\":[]}\n");
        let p = parse_lines(&out, &names, &[Kind::Count, Kind::Str], None, 9);
        assert_eq!((p.lines, p.stopped), (0, true)); // no vector field named: not taken
        // Named with their kinds, the lines read back to what was written.
        let all: [&[u8]; 4] = [b"id", b"text", b"vector", b"clusters"];
        let p = parse_lines(&out, &all, &[Kind::Count, Kind::Str, Kind::Vector, Kind::Pairs], None, 9);
        assert_eq!((p.lines, p.stopped, p.consumed, p.dim), (2, false, out.len(), 2));
        assert_eq!(p.vectors, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!((p.pair_counts, p.pair_ids, p.pair_aff), (vec![1, 0], vec![4], vec![0.5]));
    }

    #[test]
    fn nine_significant_digits_as_printf() {
        for (x, want) in [(0.0, "0"), (0.5, "0.5"), (0.650258839, "0.650258839"), (1.0, "1"), (-0.25, "-0.25"),
                          (0.0409482084, "0.0409482084"), (1.5e-5, "1.5e-05"), (123456789.0, "123456789"),
                          (1234567890.0, "1.23456789e+09"), (0.0001, "0.0001"), (0.99999999999, "1"),
                          (f32::MIN_POSITIVE as f64, "1.17549435e-38")] {
            let mut out = Vec::new();
            g9(x, &mut out);
            assert_eq!(std::str::from_utf8(&out).unwrap(), want, "{x}");
        }
    }

    #[test]
    fn python_float_repr() {
        for (x, want) in [(0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (0.1, "0.1"), (1e16, "1e+16"),
                          (1.5e16, "1.5e+16"), (1e15, "1000000000000000.0"), (0.0001, "0.0001"),
                          (1e-05, "1e-05"), (1.0 / 7.0, "0.14285714285714285"), (-2.5e-300, "-2.5e-300"),
                          (123456.789, "123456.789"), (1.7976931348623157e308, "1.7976931348623157e+308")] {
            assert_eq!(python_repr(x), want);
        }
    }

    #[test]
    fn canonical_is_json_dumps_form() {
        for yes in [r#"{}"#, r#"{"a": 1, "b": [true, null, "x\n\u001f\"\\"], "c": {"d": -2.5}}"#,
                    "{\"\u{e9}\": \"\u{fc}/\u{7f}\", \"n\": 12345678901234567890123}", r#"{"x": 0.14285714285714285}"#] {
            assert!(canonical(yes.as_bytes()), "{yes}");
        }
        for no in [r#"{"a":1}"#, r#"{"a": 1,"b": 2}"#, r#"{ "a": 1}"#, r#"{"a": 1, "a": 2}"#, r#"{"a": "\/"}"#,
                   r#"{"a": "\u00e9"}"#, r#"{"a": "\u001F"}"#, r#"{"a": "\u000a"}"#, r#"{"a": 1.50}"#,
                   r#"{"a": 1e2}"#, r#"{"a": -0}"#, r#"{"a": 1E+16}"#, r#"{"a": [1,2]}"#] {
            assert!(!canonical(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn is_object_takes_one_json_object_and_nothing_else() {
        let mut scratch = Vec::new();
        for yes in [r#"{}"#, r#" {"a":1, "b" : [true, null, "x\n\ud83d\ude00"]} "#, "{\"\u{e9}\": {\"d\": -2.5e3}}"] {
            assert!(is_object(yes.as_bytes(), &mut scratch), "{yes}");
        }
        let deep = format!("{}{}", "{\"a\": ".repeat(80), "}".repeat(80));
        for no in [r#"[]"#, r#""a""#, r#"1"#, r#"{"a": 1} x"#, r#"{"a": 1"#, r#"{"a": NaN}"#, r#"{"a": 01}"#,
                   "{\"a\": \"\u{1}\"}", r#"{"a": "\udc00"}"#, r#"{'a': 1}"#, "", deep.as_str()] {
            assert!(!is_object(no.as_bytes(), &mut scratch), "{no}");
        }
    }

    #[test]
    fn max_lines_and_a_last_line_without_newline() {
        let line = "{\"text\":\"a\",\"vector\":\"AACAPwAAAEA=\"}";
        let input = format!("{line}\n{line}\n{line}");
        let p = parse_lines(input.as_bytes(), &NAMES, &KINDS, None, 2);
        assert_eq!((p.lines, p.consumed, p.stopped), (2, 2 * (line.len() + 1), false));
        let p = parse(&input);
        assert_eq!((p.lines, p.consumed, p.stopped), (3, input.len(), false));
        let p = parse_lines(input.as_bytes(), &NAMES, &KINDS, Some(3), 2);
        assert_eq!((p.lines, p.stopped, p.dim), (0, true, 3));
    }
}
