//! The client's side of a proxied HTTP/1 connection, request by request: each request head must
//! name an allowed server before a byte of it goes on, and its body is passed through by its
//! own framing (`Content-Length` or chunked), so that the next head is found exactly where the
//! server will look for it. A kept-alive or pipelined connection therefore cannot carry a
//! second request to another server behind an allowed first one.
//!
//! Anything whose framing a server could read differently is refused: `Content-Length` and
//! `Transfer-Encoding` together, several of either, codings other than `chunked`, malformed
//! chunk sizes. So are requests that would turn the connection into something else (`CONNECT`,
//! `Upgrade`), which the proxy could no longer follow. Responses pass through untouched.

use super::peek::host_name;

/// The longest request head, and the longest trailer section, read.
pub const MAX_HEAD: usize = 16 * 1024;
/// The longest chunk-size line read.
const MAX_CHUNK_LINE: usize = 1024;
const MAX_HEADERS: usize = 100;

/// Why a connection is cut.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(why.into()))
}

/// What the checker has let through so far, for one call of [`Requests::feed`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Passed {
    /// Bytes that may go on to the server, in order.
    pub bytes: Vec<u8>,
    /// The server each newly passed request head named.
    pub names: Vec<String>,
}

#[derive(Debug)]
enum State {
    /// Collecting the next request head (bytes held back until it is whole and allowed).
    Head(Vec<u8>),
    /// This many body bytes to go.
    Body(u64),
    /// A chunk-size line so far.
    ChunkSize(Vec<u8>),
    /// This many chunk bytes to go, then CRLF.
    ChunkData(u64),
    /// The CRLF after a chunk: how many of its bytes have been seen.
    ChunkEnd(u8),
    /// Trailer lines after the last chunk, up to the blank line.
    Trailers(Vec<u8>),
}

/// Follows one connection's requests.
#[derive(Debug)]
pub struct Requests {
    state: State,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            state: State::Head(Vec::new()),
        }
    }
}

impl Requests {
    /// Takes the next bytes the client sent. `allowed` says whether a server name may be
    /// reached.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        allowed: &dyn Fn(&str) -> bool,
    ) -> Result<Passed, Refusal> {
        let mut passed = Passed::default();
        while !input.is_empty() {
            match &mut self.state {
                State::Head(head) => {
                    let before = head.len();
                    head.extend_from_slice(input);
                    let Some((end, name, body)) = parse_head(head, allowed)? else {
                        if head.len() > MAX_HEAD {
                            return refuse("the request head is too long");
                        }
                        return Ok(passed);
                    };
                    passed.bytes.extend_from_slice(&head[..end]);
                    passed.names.push(name);
                    input = &input[end - before..];
                    self.state = body;
                }
                State::Body(left) => {
                    let n = take(&mut input, left, &mut passed);
                    if n == 0 {
                        self.state = State::Head(Vec::new());
                    }
                }
                State::ChunkSize(line) => {
                    let byte = take_byte(&mut input, &mut passed);
                    line.push(byte);
                    if line.len() > MAX_CHUNK_LINE {
                        return refuse("a chunk-size line is too long");
                    }
                    if byte == b'\n' {
                        let size = chunk_size(line)?;
                        self.state = if size == 0 {
                            State::Trailers(Vec::new())
                        } else {
                            State::ChunkData(size)
                        };
                    }
                }
                State::ChunkData(left) => {
                    if take(&mut input, left, &mut passed) == 0 {
                        self.state = State::ChunkEnd(0);
                    }
                }
                State::ChunkEnd(seen) => {
                    if take_byte(&mut input, &mut passed) != b"\r\n"[usize::from(*seen)] {
                        return refuse("a chunk does not end with CRLF");
                    }
                    *seen += 1;
                    if *seen == 2 {
                        self.state = State::ChunkSize(Vec::new());
                    }
                }
                State::Trailers(lines) => {
                    lines.push(take_byte(&mut input, &mut passed));
                    if lines.len() > MAX_HEAD {
                        return refuse("the trailers are too long");
                    }
                    if lines.ends_with(b"\n") {
                        let line_start = lines[..lines.len() - 1]
                            .iter()
                            .rposition(|&b| b == b'\n')
                            .map_or(0, |i| i + 1);
                        if matches!(&lines[line_start..], b"\r\n" | b"\n") {
                            self.state = State::Head(Vec::new());
                        }
                    }
                }
            }
        }
        Ok(passed)
    }
}

/// Moves the first byte of `input` (which is not empty) into `passed`, and returns it.
fn take_byte(input: &mut &[u8], passed: &mut Passed) -> u8 {
    let byte = input[0];
    *input = &input[1..];
    passed.bytes.push(byte);
    byte
}

/// Moves up to `left` bytes of `input` into `passed`; returns how many are left to go.
fn take(input: &mut &[u8], left: &mut u64, passed: &mut Passed) -> u64 {
    let n = usize::try_from(*left)
        .unwrap_or(usize::MAX)
        .min(input.len());
    passed.bytes.extend_from_slice(&input[..n]);
    *input = &input[n..];
    *left -= n as u64;
    *left
}

/// A chunk-size line: hex digits, then optional extensions after `;`.
fn chunk_size(line: &[u8]) -> Result<u64, Refusal> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    let digits = digits.trim_ascii_end();
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return refuse("a malformed chunk size");
    }
    let text = std::str::from_utf8(digits).map_err(|_| Refusal("a malformed chunk size".into()))?;
    u64::from_str_radix(text, 16).map_err(|_| Refusal("a malformed chunk size".into()))
}

/// Parses the head at the start of `buf`. `Ok(None)`: not whole yet. `Ok(Some(..))`: its length,
/// the server it names and what follows it.
fn parse_head(
    buf: &[u8],
    allowed: &dyn Fn(&str) -> bool,
) -> Result<Option<(usize, String, State)>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let end = match req.parse(buf) {
        Ok(httparse::Status::Complete(end)) if end > MAX_HEAD => {
            return refuse("the request head is too long")
        }
        Ok(httparse::Status::Complete(end)) => end,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return refuse(format!("not an HTTP/1 request ({e})")),
    };
    let (method, target) = (req.method.unwrap_or(""), req.path.unwrap_or(""));
    if method.eq_ignore_ascii_case("CONNECT") {
        return refuse("CONNECT is not followed through the proxy");
    }
    let mut host = None;
    let mut length = None;
    let mut chunked = None;
    for h in req.headers.iter() {
        let value = h.value.trim_ascii();
        if h.name.eq_ignore_ascii_case("host") {
            if host.replace(value).is_some() {
                return refuse("two Host headers");
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| Refusal("a malformed Content-Length".into()))?;
            if length.replace(n).is_some() {
                return refuse("two Content-Length headers");
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if !value.eq_ignore_ascii_case(b"chunked") || chunked.replace(()).is_some() {
                return refuse("a Transfer-Encoding other than one `chunked`");
            }
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            return refuse("Upgrade is not followed through the proxy");
        }
    }
    let name = host
        .and_then(host_part)
        .ok_or_else(|| Refusal("no usable Host header".into()))?;
    // A server takes the name in an absolute-form target over the Host header.
    if !target.starts_with('/') && target != "*" {
        let named = absolute_target_host(target)
            .ok_or_else(|| Refusal(format!("an unusable request target {target:?}")))?;
        if !allowed(&named) {
            return refuse(format!("{named} is not an allowed domain"));
        }
    }
    if !allowed(&name) {
        return refuse(format!("{name} is not an allowed domain"));
    }
    let next = match (length, chunked) {
        (Some(_), Some(())) => return refuse("both Content-Length and Transfer-Encoding"),
        (_, Some(())) if req.version == Some(0) => {
            return refuse("Transfer-Encoding in an HTTP/1.0 request")
        }
        (_, Some(())) => State::ChunkSize(Vec::new()),
        (Some(n), None) if n > 0 => State::Body(n),
        _ => State::Head(Vec::new()),
    };
    Ok(Some((end, name, next)))
}

/// The name in a Host value (`name[:port]`); IP literals in brackets are not names.
fn host_part(value: &[u8]) -> Option<String> {
    let name = match value.iter().rposition(|&b| b == b':') {
        Some(colon) if value[colon + 1..].iter().all(u8::is_ascii_digit) => &value[..colon],
        _ => value,
    };
    host_name(name)
}

/// The host of `http://host[:port]/...` (any scheme).
fn absolute_target_host(target: &str) -> Option<String> {
    let (_, rest) = target.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.contains('@') {
        return None; // userinfo: a confusing way to write a host
    }
    host_part(authority.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(name: &'static str) -> impl Fn(&str) -> bool {
        move |n| n == name
    }

    fn run(input: &[u8]) -> Result<Passed, Refusal> {
        Requests::default().feed(input, &only("allowed.example"))
    }

    #[test]
    fn every_kept_alive_request_is_checked() {
        let ok = b"GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n";
        let passed = run(ok).unwrap();
        assert_eq!((passed.bytes.as_slice(), passed.names.len()), (&ok[..], 1));
        let two = [&ok[..], b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n"].concat();
        assert!(
            run(&two).is_err(),
            "the second request names another server"
        );
        // Fed in pieces, the second head is still refused before any of it passes.
        let mut requests = Requests::default();
        let allowed = only("allowed.example");
        let first = requests.feed(&two[..ok.len() + 10], &allowed).unwrap();
        assert_eq!(first.bytes, ok);
        assert!(requests.feed(&two[ok.len() + 10..], &allowed).is_err());
    }

    #[test]
    fn bodies_are_skipped_by_their_framing() {
        // A body that looks like a request to another server is only a body.
        let inner = b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n";
        let with_length = [
            format!(
                "POST / HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: {}\r\n\r\n",
                inner.len()
            )
            .as_bytes(),
            inner,
            b"GET /next HTTP/1.1\r\nHost: allowed.example\r\n\r\n",
        ]
        .concat();
        let passed = run(&with_length).unwrap();
        assert_eq!(
            (passed.bytes.len(), passed.names.len()),
            (with_length.len(), 2)
        );

        let chunked = [
            &b"POST / HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            format!("{:x};ext=1\r\n", inner.len()).as_bytes(),
            inner,
            b"\r\n0\r\nX-Trailer: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n",
        ]
        .concat();
        let mut requests = Requests::default();
        let allowed = only("allowed.example");
        // Byte by byte: the framing holds whatever the reads' boundaries.
        let mut total = Passed::default();
        let mut refused = None;
        for (i, b) in chunked.iter().enumerate() {
            match requests.feed(std::slice::from_ref(b), &allowed) {
                Ok(p) => {
                    total.bytes.extend(p.bytes);
                    total.names.extend(p.names);
                }
                Err(e) => {
                    refused = Some((i, e));
                    break;
                }
            }
        }
        let (at, _) = refused.expect("the request after the chunked body is refused");
        assert_eq!(total.names, ["allowed.example"]);
        assert!(
            at >= chunked.len() - inner.len(),
            "refused at its head, not in the body"
        );
        assert_eq!(total.bytes.len(), chunked.len() - inner.len());
    }

    #[test]
    fn ambiguous_framing_and_tunnels_are_refused() {
        for bad in [
            &b"POST / HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: +3\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: allowed.example\r\nHost: other.example\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: allowed.example\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT other.example:443 HTTP/1.1\r\nHost: allowed.example\r\n\r\n",
            b"GET http://other.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n",
            b"GET http://x@other.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"POST / HTTP/1.0\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : allowed.example\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxyz",
        ] {
            assert!(run(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(run(&[b'a'; MAX_HEAD + 1]).is_err());
        let absolute = b"GET http://allowed.example:80/x HTTP/1.1\r\nHost: allowed.example\r\n\r\n";
        assert_eq!(run(absolute).unwrap().names, ["allowed.example"]);
        let blank_first = b"\r\nGET / HTTP/1.1\r\nHost: allowed.example:8080\r\n\r\n";
        assert_eq!(run(blank_first).unwrap().bytes, blank_first);
    }
}
