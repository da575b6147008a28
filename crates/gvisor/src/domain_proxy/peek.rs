//! Reading the server name a connection's first bytes announce: the SNI of a TLS ClientHello
//! or the `Host` header of an HTTP/1 request. The bytes come from a hostile sandbox: every read
//! is bounds-checked, and an unclear answer is "no name".

/// What the first bytes say so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    /// The name, lower-case, without a port or trailing dot.
    Name(String),
    /// Not enough bytes yet to tell.
    NeedMore,
    /// Neither TLS with SNI nor HTTP with a Host header.
    NoName,
}

/// Reads as much of `buf` (the connection's first bytes) as it needs.
pub fn server_name(buf: &[u8]) -> Peek {
    match buf.first() {
        None => Peek::NeedMore,
        Some(0x16) => tls_sni(buf),
        Some(b) if b.is_ascii_uppercase() => http_host(buf),
        Some(_) => Peek::NoName,
    }
}

const TLS_HEADER: usize = 5;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

/// The SNI of a ClientHello that fits in the first record (real ones do; they are at most a
/// few KiB, and a record carries 16 KiB).
fn tls_sni(buf: &[u8]) -> Peek {
    if buf.len() < TLS_HEADER {
        return Peek::NeedMore;
    }
    let record_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    let Some(record) = buf.get(TLS_HEADER..TLS_HEADER + record_len) else {
        return Peek::NeedMore;
    };
    sni_in_client_hello(record).map_or(Peek::NoName, Peek::Name)
}

fn sni_in_client_hello(record: &[u8]) -> Option<String> {
    let mut r = Reader(record);
    if r.u8()? != HANDSHAKE_CLIENT_HELLO {
        return None;
    }
    let body_len = r.u24()?;
    let mut hello = Reader(r.take(body_len)?);
    hello.take(2 + 32)?; // version, random
    let session = usize::from(hello.u8()?);
    hello.take(session)?;
    let suites = usize::from(hello.u16()?);
    hello.take(suites)?;
    let compression = usize::from(hello.u8()?);
    hello.take(compression)?;
    let extensions_len = usize::from(hello.u16()?);
    let mut extensions = Reader(hello.take(extensions_len)?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let len = usize::from(extensions.u16()?);
        let data = extensions.take(len)?;
        if kind != EXTENSION_SERVER_NAME {
            continue;
        }
        let mut list = Reader(data);
        let list_len = usize::from(list.u16()?);
        let mut names = Reader(list.take(list_len)?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let len = usize::from(names.u16()?);
            let name = names.take(len)?;
            if name_type == NAME_TYPE_HOST {
                return host_name(name);
            }
        }
        return None;
    }
    None
}

/// At most this much of an HTTP request head is read looking for `Host`.
const MAX_HTTP_HEAD: usize = 16 * 1024;

fn http_host(buf: &[u8]) -> Peek {
    // Only the first MAX_HTTP_HEAD bytes count, so that reading more never changes the answer.
    let head = &buf[..buf.len().min(MAX_HTTP_HEAD)];
    let Some(end) = find(head, b"\r\n\r\n") else {
        return if buf.len() >= MAX_HTTP_HEAD {
            Peek::NoName
        } else {
            Peek::NeedMore
        };
    };
    let mut lines = buf[..end]
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    if !request_line.ends_with(b" HTTP/1.1") && !request_line.ends_with(b" HTTP/1.0") {
        return Peek::NoName;
    }
    let mut hosts = lines.filter_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        line[..colon]
            .eq_ignore_ascii_case(b"host")
            .then(|| line[colon + 1..].trim_ascii())
    });
    match (hosts.next(), hosts.next()) {
        // Two Host headers are a smuggling attempt, not a name.
        (Some(host), None) => {
            let name = match host.iter().rposition(|&b| b == b':') {
                Some(colon) if host[colon + 1..].iter().all(u8::is_ascii_digit) => &host[..colon],
                _ => host,
            };
            host_name(name).map_or(Peek::NoName, Peek::Name)
        }
        _ => Peek::NoName,
    }
}

/// A DNS host name: letters, digits, `-`, `_` and dots; lower-cased, trailing dot dropped.
fn host_name(raw: &[u8]) -> Option<String> {
    let raw = raw.strip_suffix(b".").unwrap_or(raw);
    let ok = !raw.is_empty()
        && raw.len() <= 253
        && raw
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    ok.then(|| String::from_utf8_lossy(raw).to_ascii_lowercase())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        let b = self.take(3)?;
        Some(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record naming `name`.
    fn client_hello(name: &str) -> Vec<u8> {
        let mut sni = Vec::new();
        sni.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name.as_bytes());
        let mut extensions = Vec::new();
        // An unrelated extension first (supported_versions), then server_name.
        extensions.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        extensions.extend_from_slice(&[0x00, 0x00]);
        extensions.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        extensions.extend_from_slice(&sni);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(&extensions);
        let mut handshake = vec![1];
        handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        handshake.extend_from_slice(&body);
        let mut record = vec![0x16, 0x03, 0x01];
        record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
        record.extend_from_slice(&handshake);
        record
    }

    #[test]
    fn reads_sni() {
        let hello = client_hello("PyPI.org");
        assert_eq!(server_name(&hello), Peek::Name("pypi.org".into()));
        for cut in [1, 4, 5, hello.len() - 1] {
            assert_eq!(server_name(&hello[..cut]), Peek::NeedMore, "cut at {cut}");
        }
        let mut broken = hello.clone();
        broken[5] = 2; // ServerHello
        assert_eq!(server_name(&broken), Peek::NoName);
        assert_eq!(server_name(&client_hello("a b.com")), Peek::NoName);
    }

    #[test]
    fn reads_http_host() {
        let req = b"GET /simple/ HTTP/1.1\r\nUser-Agent: x\r\nhost: PyPI.org:8080\r\n\r\n";
        assert_eq!(server_name(req), Peek::Name("pypi.org".into()));
        assert_eq!(server_name(&req[..20]), Peek::NeedMore);
        let two = b"GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n";
        assert_eq!(server_name(two), Peek::NoName);
        assert_eq!(server_name(b"GET / HTTP/1.1\r\n\r\n"), Peek::NoName);
        assert_eq!(server_name(b"SSH-2.0-OpenSSH\r\n\r\n"), Peek::NoName);
        assert_eq!(server_name(b"\x00\x01"), Peek::NoName);
        assert_eq!(server_name(&[b'G'; MAX_HTTP_HEAD]), Peek::NoName);
    }
}
