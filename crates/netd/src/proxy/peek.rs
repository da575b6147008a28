//! Telling what a connection's first bytes are: a TLS ClientHello (and the server name its SNI
//! carries), the start of an HTTP/1 request, or a protocol that names nothing. The bytes come
//! from a hostile sandbox: every read is bounds-checked, and an unclear answer never names a
//! server.

/// What the first bytes say so far.
#[derive(Debug, PartialEq, Eq)]
pub enum First {
    /// A TLS ClientHello whose SNI names this server (lower-case, no trailing dot).
    Tls(String),
    /// The start of an HTTP/1 request: each request head on the connection names its server.
    Http,
    /// Neither TLS nor HTTP: a protocol that names nothing.
    Unnamed,
    /// TLS without a server name, or a ClientHello that cannot be read.
    Refused,
    /// Not enough bytes yet to tell.
    NeedMore,
}

/// The most that is read before deciding: one full TLS record.
pub const MAX_FIRST: usize = 5 + (16 << 10);

/// Reads as much of `buf` (the connection's first bytes) as it needs. Once it answers anything
/// but [`First::NeedMore`], more bytes never change the answer.
pub fn classify(buf: &[u8]) -> First {
    // Nothing beyond the first MAX_FIRST bytes counts, so that reading more never changes the
    // answer.
    let buf = &buf[..buf.len().min(MAX_FIRST)];
    // Servers skip blank lines before a request line, so a sandbox could hide a request behind
    // them: they do not make a protocol nameless.
    let start = buf.iter().position(|b| !b" \t\r\n".contains(b));
    match start.map(|i| buf[i]) {
        None if buf.len() >= MAX_FIRST => First::Unnamed,
        None => First::NeedMore,
        Some(0x16) if start == Some(0) => match tls_sni(buf) {
            Sni::Name(name) => First::Tls(name),
            Sni::None => First::Refused,
            Sni::NeedMore if buf.len() >= MAX_FIRST => First::Refused,
            Sni::NeedMore => First::NeedMore,
        },
        // An SSH client speaks first with its banner, which no HTTP server takes for a request.
        Some(b'S') if start == Some(0) && b"SSH-".starts_with(&buf[..buf.len().min(4)]) => {
            if buf.len() < 4 {
                First::NeedMore
            } else {
                First::Unnamed
            }
        }
        // Every HTTP method starts with a letter; so does anything a server might take for one.
        Some(b) if b.is_ascii_alphabetic() => First::Http,
        Some(_) => First::Unnamed,
    }
}

enum Sni {
    Name(String),
    None,
    NeedMore,
}

const TLS_HEADER: usize = 5;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

/// The SNI of a ClientHello that fits in the first record (real ones do; they are at most a
/// few KiB, and a record carries 16 KiB).
fn tls_sni(buf: &[u8]) -> Sni {
    if buf.len() < TLS_HEADER {
        return Sni::NeedMore;
    }
    let record_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    let Some(record) = buf.get(TLS_HEADER..TLS_HEADER + record_len) else {
        return Sni::NeedMore;
    };
    sni_in_client_hello(record).map_or(Sni::None, Sni::Name)
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

/// A DNS host name: letters, digits, `-`, `_` and dots; lower-cased, trailing dot dropped.
pub fn host_name(raw: &[u8]) -> Option<String> {
    let raw = raw.strip_suffix(b".").unwrap_or(raw);
    let ok = !raw.is_empty()
        && raw.len() <= 253
        && raw
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    ok.then(|| String::from_utf8_lossy(raw).to_ascii_lowercase())
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
        assert_eq!(classify(&hello), First::Tls("pypi.org".into()));
        for cut in [1, 4, 5, hello.len() - 1] {
            assert_eq!(classify(&hello[..cut]), First::NeedMore, "cut at {cut}");
        }
        let mut broken = hello.clone();
        broken[5] = 2; // ServerHello
        assert_eq!(classify(&broken), First::Refused);
        assert_eq!(classify(&client_hello("a b.com")), First::Refused);
    }

    #[test]
    fn tells_http_from_what_names_nothing() {
        assert_eq!(classify(b"G"), First::Http);
        assert_eq!(
            classify(b"\r\n\r\nGET / HTTP/1.1\r\n"),
            First::Http,
            "blank lines first"
        );
        assert_eq!(classify(b"\r\n"), First::NeedMore);
        assert_eq!(
            classify(b"SSH-2.0-OpenSSH_9.2\r\n"),
            First::Unnamed,
            "an SSH banner"
        );
        assert_eq!(classify(b"SS"), First::NeedMore);
        assert_eq!(
            classify(b"SSL / HTTP/1.1"),
            First::Http,
            "other letters: held to HTTP's rules"
        );
        assert_eq!(classify(b"\x00\x01"), First::Unnamed);
        assert_eq!(classify(b"*1\r\n$4\r\nPING\r\n"), First::Unnamed, "redis");
        assert_eq!(classify(&[b'\n'; MAX_FIRST]), First::Unnamed);
        assert_eq!(
            classify(b" \x16\x03\x01"),
            First::Unnamed,
            "TLS starts at byte 0"
        );
    }
}
