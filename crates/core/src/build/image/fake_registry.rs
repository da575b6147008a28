//! A registry for the pull's tests: a loopback HTTP server that answers each request as the
//! test says, with no end too.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub enum Answer {
    /// A status, headers and a body.
    Body(u16, Vec<(&'static str, String)>, Vec<u8>),
    /// 200 and `chunk` again and again, with no length, until the client leaves.
    Endless(Vec<u8>),
    /// 200 and a byte a second.
    Trickle,
}

/// A JSON answer.
pub fn json(status: u16, body: &[u8]) -> Answer {
    let headers = vec![("Content-Type", "application/json".to_owned())];
    Answer::Body(status, headers, body.to_vec())
}

/// A 401 with a `Bearer` challenge whose realm is `/token` on the host `head` asked.
pub fn challenge(head: &str) -> Answer {
    let host = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("host: ")
                .or_else(|| l.strip_prefix("Host: "))
        })
        .unwrap_or_default();
    let challenge = format!(r#"Bearer realm="http://{host}/token",service="s""#);
    Answer::Body(401, vec![("WWW-Authenticate", challenge)], vec![])
}

pub struct FakeRegistry {
    pub address: String,
    /// The paths asked for, in order.
    pub asked: Arc<Mutex<Vec<String>>>,
}

impl FakeRegistry {
    /// Answers each request by `answer(path, head)`.
    pub async fn start(answer: impl Fn(&str, &str) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (answer, seen) = (Arc::new(answer), asked.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (answer, seen) = (answer.clone(), seen.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, &*answer, &seen).await;
                });
            }
        });
        FakeRegistry { address, asked }
    }
}

async fn serve(
    mut conn: TcpStream,
    answer: &(dyn Fn(&str, &str) -> Answer + Send + Sync),
    seen: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    // The pull's guard forwards plain HTTP in absolute form.
    let target = head.split(' ').nth(1).unwrap_or("");
    let path = match target.strip_prefix("http://") {
        Some(rest) => &rest[rest.find('/').unwrap_or(rest.len())..],
        None => target,
    };
    seen.lock().unwrap().push(path.to_owned());
    match answer(path, &head) {
        Answer::Body(status, headers, body) => {
            let mut out = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n", body.len());
            for (name, value) in headers {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
            out.push_str("Connection: close\r\n\r\n");
            conn.write_all(out.as_bytes()).await?;
            conn.write_all(&body).await
        }
        Answer::Endless(chunk) => {
            conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
                .await?;
            loop {
                conn.write_all(&chunk).await?;
            }
        }
        Answer::Trickle => {
            conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
                .await?;
            loop {
                conn.write_all(b" ").await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
