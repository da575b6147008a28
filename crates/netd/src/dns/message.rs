//! Just enough of the DNS wire format (RFC 1035) to police a query and read A records from its
//! answer. Everything here reads bytes a hostile sandbox (or a spoofing upstream) chose, so every
//! read is bounds-checked and name compression is followed a bounded number of times.

use std::net::Ipv4Addr;

const HEADER_LEN: usize = 12;
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
/// Compression pointers followed per name: more than any honest name needs.
const MAX_POINTERS: usize = 16;
const MAX_NAME_LEN: usize = 255;

pub const RCODE_FORMERR: u8 = 1;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_REFUSED: u8 = 5;

/// A query with exactly one question.
#[derive(Debug, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Lower-case, dot-separated, without the root's trailing dot.
    pub name: String,
    /// Where the question ends: header and question are echoed in refusals.
    question_end: usize,
}

/// Reads a query: a header with QR clear and exactly one question.
pub fn parse_query(msg: &[u8]) -> Option<Query> {
    if msg.len() < HEADER_LEN || msg[2] & 0x80 != 0 || u16_at(msg, 4)? != 1 {
        return None;
    }
    let (name, after_name) = read_name(msg, HEADER_LEN)?;
    let question_end = after_name.checked_add(4)?;
    (question_end <= msg.len()).then_some(Query {
        id: u16_at(msg, 0)?,
        name,
        question_end,
    })
}

impl Query {
    /// The question section of `msg` (the query this was read from), as a reply must echo it.
    pub fn question<'a>(&self, msg: &'a [u8]) -> &'a [u8] {
        &msg[HEADER_LEN..self.question_end]
    }
}

/// Whether `reply` answers the query with this `id` and this `question` section: a response,
/// with one question, the very same.
pub fn answers(reply: &[u8], id: u16, question: &[u8]) -> bool {
    reply.len() >= HEADER_LEN + question.len()
        && u16_at(reply, 0) == Some(id)
        && reply[2] & 0x80 != 0
        && u16_at(reply, 4) == Some(1)
        && &reply[HEADER_LEN..HEADER_LEN + question.len()] == question
}

/// A recursive query for `name`'s A records, with id 0. `None` for a name DNS cannot carry.
pub fn a_query(name: &str) -> Option<Vec<u8>> {
    let mut msg = vec![0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|l| (1..=63).contains(l))?;
        msg.push(len);
        msg.extend_from_slice(label.as_bytes());
    }
    msg.push(0);
    msg.extend_from_slice(&TYPE_A.to_be_bytes());
    msg.extend_from_slice(&CLASS_IN.to_be_bytes());
    (msg.len() - HEADER_LEN <= MAX_NAME_LEN + 5).then_some(msg)
}

/// The answer to `query` (whose bytes are `msg`) that carries only `rcode`.
pub fn error_reply(msg: &[u8], query: Option<&Query>, rcode: u8) -> Vec<u8> {
    let echoed = query.map_or(HEADER_LEN.min(msg.len()), |q| q.question_end);
    let mut out = msg[..echoed].to_vec();
    if out.len() < HEADER_LEN {
        out.resize(HEADER_LEN, 0);
    }
    // QR set, opcode and RD kept; RA set; the rest of the flags cleared.
    out[2] = 0x80 | (out[2] & 0x79);
    out[3] = 0x80 | (rcode & 0x0f);
    let questions: u16 = query.is_some().into();
    out[4..6].copy_from_slice(&questions.to_be_bytes());
    out[6..12].fill(0);
    out
}

/// The A records in a response's answer section, with their TTLs, if it answers `id`.
/// Answers under any name count: a CNAME chain ends in the addresses of the name asked for.
pub fn answer_addrs(msg: &[u8], id: u16) -> Option<Vec<(Ipv4Addr, u32)>> {
    if msg.len() < HEADER_LEN || u16_at(msg, 0)? != id || msg[2] & 0x80 == 0 {
        return None;
    }
    let questions = u16_at(msg, 4)?;
    let answers = u16_at(msg, 6)?;
    let mut at = HEADER_LEN;
    for _ in 0..questions {
        at = read_name(msg, at)?.1.checked_add(4)?;
    }
    let mut addrs = Vec::new();
    for _ in 0..answers {
        let after_name = read_name(msg, at)?.1;
        let rtype = u16_at(msg, after_name)?;
        let class = u16_at(msg, after_name + 2)?;
        let ttl = u32::from_be_bytes(msg.get(after_name + 4..after_name + 8)?.try_into().ok()?);
        let len = usize::from(u16_at(msg, after_name + 8)?);
        let data = msg.get(after_name + 10..after_name + 10 + len)?;
        if rtype == TYPE_A && class == CLASS_IN && len == 4 {
            addrs.push((Ipv4Addr::new(data[0], data[1], data[2], data[3]), ttl));
        }
        at = after_name + 10 + len;
    }
    Some(addrs)
}

fn u16_at(msg: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(
        msg.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

/// Reads the name at `start`; returns it and where the record goes on after it.
fn read_name(msg: &[u8], start: usize) -> Option<(String, usize)> {
    let mut name = String::new();
    let mut at = start;
    let mut resume_at = None;
    let mut pointers = 0;
    loop {
        let len = *msg.get(at)?;
        match len & 0xc0 {
            0x00 if len == 0 => {
                return Some((name, resume_at.unwrap_or(at + 1)));
            }
            0x00 => {
                let label = msg.get(at + 1..at + 1 + usize::from(len))?;
                if !name.is_empty() {
                    name.push('.');
                }
                for &b in label {
                    // Escaped so that no label can smuggle a dot or a control byte into a match.
                    match b {
                        b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => name.push(char::from(b)),
                        b'A'..=b'Z' => name.push(char::from(b.to_ascii_lowercase())),
                        _ => name.push_str(&format!("\\{b:03}")),
                    }
                }
                if name.len() > MAX_NAME_LEN * 4 {
                    return None;
                }
                at += 1 + usize::from(len);
            }
            0xc0 => {
                pointers += 1;
                if pointers > MAX_POINTERS {
                    return None;
                }
                let target = usize::from(u16_at(msg, at)? & 0x3fff);
                resume_at.get_or_insert(at + 2);
                at = target;
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dig pypi.org A` as glibc sends it: id 0xbeef, RD set.
    fn query(name: &str) -> Vec<u8> {
        let mut q = vec![0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        q
    }

    #[test]
    fn reads_queries() {
        let q = parse_query(&query("PyPI.org")).unwrap();
        assert_eq!((q.id, q.name.as_str()), (0xbeef, "pypi.org"));
        let mut response = query("pypi.org");
        response[2] |= 0x80;
        assert_eq!(parse_query(&response), None);
        assert_eq!(parse_query(&query("pypi.org")[..15]), None);
        // A dot inside a label is not a separator.
        let mut sneaky = vec![
            0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, b'a', b'.', b'b', 0, 0, 1, 0, 1,
        ];
        assert_eq!(parse_query(&sneaky).unwrap().name, "a\\046b");
        sneaky[12] = 0x40;
        assert_eq!(parse_query(&sneaky), None);
    }

    #[test]
    fn refusals_echo_the_question() {
        let msg = query("x.example");
        let q = parse_query(&msg).unwrap();
        let r = error_reply(&msg, Some(&q), RCODE_REFUSED);
        assert_eq!(&r[..2], &[0xbe, 0xef]);
        assert_eq!(r[2], 0x81, "QR and RD");
        assert_eq!(r[3] & 0x0f, RCODE_REFUSED);
        assert_eq!(&r[12..], &msg[12..]);
        let r = error_reply(&[1, 2, 3], None, RCODE_FORMERR);
        assert_eq!(r.len(), 12);
        assert_eq!(&r[4..6], &[0, 0]);
    }

    #[test]
    fn reads_a_records_through_compression() {
        let mut msg = query("www.pypi.org");
        msg[2] |= 0x80;
        msg[7] = 3; // three answers
                    // CNAME www.pypi.org -> pypi.org (pointers to offset 12 and 16).
        msg.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 2, 0xc0, 16]);
        // A pypi.org 203.0.113.80 ttl 300, then an AAAA that is skipped.
        msg.extend_from_slice(&[0xc0, 16, 0, 1, 0, 1, 0, 0, 1, 44, 0, 4, 203, 0, 113, 80]);
        msg.extend_from_slice(&[0xc0, 16, 0, 28, 0, 1, 0, 0, 1, 44, 0, 16]);
        msg.extend_from_slice(&[0; 16]);
        assert_eq!(
            answer_addrs(&msg, 0xbeef).unwrap(),
            [(Ipv4Addr::new(203, 0, 113, 80), 300)]
        );
        assert_eq!(answer_addrs(&msg, 0xbeee), None, "another query's answer");
        assert_eq!(answer_addrs(&msg[..msg.len() - 1], 0xbeef), None);
    }

    #[test]
    fn own_queries_and_matching_answers() {
        let msg = a_query("PyPI.org").unwrap();
        let q = parse_query(&msg).unwrap();
        assert_eq!((q.id, q.name.as_str()), (0, "pypi.org"));
        let mut reply = msg.clone();
        reply[0..2].copy_from_slice(&0x1234u16.to_be_bytes());
        reply[2] |= 0x80;
        assert!(answers(&reply, 0x1234, q.question(&msg)));
        assert!(!answers(&reply, 0x1235, q.question(&msg)), "another id");
        assert!(!answers(
            &reply,
            0x1234,
            q.question(&a_query("pypi.org.evil").unwrap())
        ));
        assert!(!answers(&msg, 0, q.question(&msg)), "a query is no answer");
        assert!(a_query("a..b").is_none() && a_query(&"a".repeat(64)).is_none());
    }

    #[test]
    fn pointer_loops_end() {
        let mut msg = vec![0, 1, 0x81, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        msg.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(read_name(&msg, 12), None);
        assert_eq!(answer_addrs(&msg, 1), None);
    }
}
