//! The registry's side of a pull: the OCI distribution API over HTTP, through the pull's guard.
//! The registry is whatever the tenant names, so it may answer without end, and the server must
//! not hold what it sends: a manifest (or index) and the config are read to [`MAX_MANIFEST`], a
//! token answer to [`MAX_TOKEN`], an error's body to [`MAX_ERROR`] (the rest is not read), and
//! a blob to the size its descriptor gives, streamed to its file; each is checked against its
//! digest.

use oci_client::client::linux_amd64_resolver;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::Reference;
use reqwest::header::{ACCEPT, WWW_AUTHENTICATE};
use reqwest::{RequestBuilder, Response, StatusCode};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// The most a manifest, an index or an image's config may take.
pub const MAX_MANIFEST: u64 = 4 << 20;
/// The most a token answer may take.
pub const MAX_TOKEN: u64 = 64 << 10;
/// What is read of an error's body, for its message.
const MAX_ERROR: u64 = 64 << 10;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "the registry {registry} wants credentials for {reference} (401): pass them with \
         from_image(image, username=..., password=...)"
    )]
    NeedsCredentials { registry: String, reference: String },
    #[error(
        "the registry {registry} did not accept the credentials of '{user}' for {reference} (401)"
    )]
    Refused {
        registry: String,
        reference: String,
        user: String,
    },
    #[error("{what} is larger than {cap}, the most a pull reads of it")]
    TooLarge { what: String, cap: String },
    #[error("{what}: the registry sent more than the {size} bytes its manifest gives")]
    Longer { what: String, size: u64 },
    #[error("{what}: the registry sent {got} of its {size} bytes")]
    Shorter { what: String, got: u64, size: u64 },
    #[error("{what}: the registry answered {status}{detail}")]
    Answered {
        what: String,
        status: StatusCode,
        detail: String,
    },
    #[error("{what}: {detail}")]
    Failed { what: String, detail: String },
    #[error("{what} does not match its digest {expected} (it is {actual})")]
    Digest {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{0}")]
    Invalid(String),
}

/// How requests after the first prove who is asking.
enum Auth {
    Anonymous,
    Basic(String, String),
    Bearer(String),
}

/// Talking to one registry about one image.
pub struct Session<'a> {
    http: reqwest::Client,
    /// `scheme://registry`.
    base: String,
    reference: &'a Reference,
    credentials: Option<(String, String)>,
    auth: Auth,
}

impl<'a> Session<'a> {
    /// Asks the registry how to authenticate (`GET /v2/`): for a `Bearer` challenge, a token
    /// for pulling the image is fetched (with the credentials, if any); otherwise the
    /// credentials, if any, go with every request as HTTP basic.
    pub async fn open(
        http: reqwest::Client,
        scheme: &str,
        reference: &'a Reference,
        credentials: Option<(String, String)>,
    ) -> Result<Session<'a>, RegistryError> {
        let auth = match &credentials {
            Some((user, password)) => Auth::Basic(user.clone(), password.clone()),
            None => Auth::Anonymous,
        };
        let mut session = Session {
            base: format!("{scheme}://{}", reference.resolve_registry()),
            http,
            reference,
            credentials,
            auth,
        };
        let what = "asking the registry how to sign in";
        let ping = session
            .http
            .get(format!("{}/v2/", session.base))
            .send()
            .await
            .map_err(|e| failed(what, &e))?;
        // Only the challenge matters; its body is never read.
        let challenge = ping
            .headers()
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(Challenge::bearer);
        drop(ping);
        if let Some(challenge) = challenge {
            session.auth = Auth::Bearer(session.token(&challenge).await?);
        }
        Ok(session)
    }

    /// The image's manifest, and its digest: for an index, its linux/amd64 image's.
    pub async fn image_manifest(&self) -> Result<(OciImageManifest, String), RegistryError> {
        let named = self.reference.digest().or(self.reference.tag());
        match self.manifest(named.unwrap_or("latest")).await? {
            (OciManifest::Image(manifest), digest) => Ok((manifest, digest)),
            (OciManifest::ImageIndex(index), _) => {
                let chosen = linux_amd64_resolver(&index.manifests).ok_or_else(|| {
                    RegistryError::Invalid(format!("{} has no linux/amd64 image", self.reference))
                })?;
                match self.manifest(&chosen).await? {
                    (OciManifest::Image(manifest), digest) => Ok((manifest, digest)),
                    (OciManifest::ImageIndex(_), _) => Err(RegistryError::Invalid(format!(
                        "{}'s linux/amd64 entry is another index",
                        self.reference
                    ))),
                }
            }
        }
    }

    /// Writes the blob `desc` names to `out`: no more than its descriptor's size, which must
    /// be at most `cap`, and checked against its digest. `what` names it in errors.
    pub async fn blob(
        &self,
        desc: &OciDescriptor,
        cap: u64,
        what: &str,
        out: &mut (impl AsyncWrite + Unpin),
    ) -> Result<(), RegistryError> {
        let size = u64::try_from(desc.size)
            .map_err(|_| RegistryError::Invalid(format!("{what} has a negative size")))?;
        if size > cap {
            return Err(too_large(what, cap));
        }
        let url = format!(
            "{}/v2/{}/blobs/{}",
            self.base,
            self.reference.repository(),
            desc.digest
        );
        let mut resp = self.send(self.get(&url), what).await?;
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| failed(what, &e))? {
            got += chunk.len() as u64;
            if got > size {
                return Err(RegistryError::Longer {
                    what: what.into(),
                    size,
                });
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(|e| failed(what, &e))?;
        }
        if got < size {
            return Err(RegistryError::Shorter {
                what: what.into(),
                got,
                size,
            });
        }
        out.flush().await.map_err(|e| failed(what, &e))?;
        check_digest(what, &desc.digest, hasher)
    }

    /// The manifest `named` (a tag or a digest) and its digest.
    async fn manifest(&self, named: &str) -> Result<(OciManifest, String), RegistryError> {
        let what = format!("the manifest of {}", self.reference);
        let url = format!(
            "{}/v2/{}/manifests/{named}",
            self.base,
            self.reference.repository()
        );
        let resp = self
            .send(self.get(&url).header(ACCEPT, MANIFEST_TYPES), &what)
            .await?;
        let body = read_capped(resp, MAX_MANIFEST, &what).await?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        if named.contains(':') && named != digest {
            return Err(RegistryError::Digest {
                what,
                expected: named.into(),
                actual: digest,
            });
        }
        let manifest: OciManifest = serde_json::from_slice(&body)
            .map_err(|e| RegistryError::Invalid(format!("{what} is not an image manifest: {e}")))?;
        let version = match &manifest {
            OciManifest::Image(m) => m.schema_version,
            OciManifest::ImageIndex(i) => i.schema_version,
        };
        if version != 2 {
            return Err(RegistryError::Invalid(format!(
                "{what} is of schema version {version}; only version 2 is supported"
            )));
        }
        Ok((manifest, digest))
    }

    /// A token for pulling the image, from the challenge's realm.
    async fn token(&self, challenge: &Challenge) -> Result<String, RegistryError> {
        let what = "the registry's token answer";
        let scope = format!("repository:{}:pull", self.reference.repository());
        let mut query = vec![("scope", scope.as_str())];
        if let Some(service) = &challenge.service {
            query.push(("service", service));
        }
        let url = reqwest::Url::parse_with_params(&challenge.realm, &query).map_err(|e| {
            RegistryError::Invalid(format!("the token realm '{}': {e}", challenge.realm))
        })?;
        let mut req = self.http.get(url);
        if let Some((user, password)) = &self.credentials {
            req = req.basic_auth(user, Some(password));
        }
        let body = read_capped(self.send(req, what).await?, MAX_TOKEN, what).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Token = serde_json::from_slice(&body)
            .map_err(|e| RegistryError::Invalid(format!("{what} is not valid: {e}")))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| RegistryError::Invalid(format!("{what} holds no token")))
    }

    /// A GET of `url` with the session's credentials.
    fn get(&self, url: &str) -> RequestBuilder {
        let req = self.http.get(url);
        match &self.auth {
            Auth::Anonymous => req,
            Auth::Basic(user, password) => req.basic_auth(user, Some(password)),
            Auth::Bearer(token) => req.bearer_auth(token),
        }
    }

    /// Sends `req`; a success's response, or the error its status and body tell.
    async fn send(&self, req: RequestBuilder, what: &str) -> Result<Response, RegistryError> {
        let resp = req.send().await.map_err(|e| failed(what, &e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let (registry, reference) = (
            self.reference.resolve_registry().to_owned(),
            self.reference.to_string(),
        );
        if status == StatusCode::UNAUTHORIZED {
            return Err(match &self.credentials {
                None => RegistryError::NeedsCredentials {
                    registry,
                    reference,
                },
                Some((user, _)) => RegistryError::Refused {
                    registry,
                    reference,
                    user: user.clone(),
                },
            });
        }
        let body = read_capped(resp, MAX_ERROR, what).await.unwrap_or_default();
        Err(RegistryError::Answered {
            what: what.into(),
            status,
            detail: error_detail(&body),
        })
    }
}

/// What a `WWW-Authenticate: Bearer realm="…",service="…"` challenge says.
#[derive(Debug, PartialEq)]
struct Challenge {
    realm: String,
    service: Option<String>,
}

impl Challenge {
    /// The header's `Bearer` challenge, if it is one with a realm.
    fn bearer(header: &str) -> Option<Challenge> {
        let (scheme, params) = header.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = auth_params(params);
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        Some(Challenge {
            realm: get("realm")?,
            service: get("service"),
        })
    }
}

/// `name=value` and `name="quoted \" value"` pairs, comma-separated (RFC 7235's auth-params).
fn auth_params(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([',', ' ', '\t']);
        let Some((name, after)) = rest.split_once('=') else {
            return pairs;
        };
        let after = after.trim_start();
        let (value, used) = match after.strip_prefix('"') {
            Some(quoted) => quoted_string(quoted),
            None => {
                let len = after.find(',').unwrap_or(after.len());
                (after[..len].trim().to_owned(), len)
            }
        };
        pairs.push((name.trim().to_owned(), value));
        rest = &after[used..];
    }
}

/// A quoted-string's value, given what follows its opening quote, and the bytes it takes with
/// both its quotes.
fn quoted_string(text: &str) -> (String, usize) {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (value, i + 2),
            '\\' => value.extend(chars.next().map(|(_, c)| c)),
            c => value.push(c),
        }
    }
    (value, text.len() + 1)
}

/// The body, if it is no longer than `cap`; dropping the response mid-body closes its
/// connection, so the rest is never read.
async fn read_capped(mut resp: Response, cap: u64, what: &str) -> Result<Vec<u8>, RegistryError> {
    if resp.content_length().is_some_and(|n| n > cap) {
        return Err(too_large(what, cap));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| failed(what, &e))? {
        if (body.len() + chunk.len()) as u64 > cap {
            return Err(too_large(what, cap));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `: message; message` from a registry's `{"errors": [{"message": …}]}`, or its text.
fn error_detail(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<Message>,
    }
    #[derive(serde::Deserialize)]
    struct Message {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let text = match serde_json::from_slice::<Errors>(body) {
        Ok(errors) => errors
            .errors
            .iter()
            .map(|e| match e.message.is_empty() {
                true => e.code.clone(),
                false => e.message.clone(),
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(_) => String::from_utf8_lossy(body).chars().take(300).collect(),
    };
    match text.trim() {
        "" => String::new(),
        text => format!(": {text}"),
    }
}

fn check_digest(what: &str, expected: &str, hasher: Sha256) -> Result<(), RegistryError> {
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    if actual == expected {
        return Ok(());
    }
    Err(RegistryError::Digest {
        what: what.into(),
        expected: expected.into(),
        actual,
    })
}

fn too_large(what: &str, cap: u64) -> RegistryError {
    RegistryError::TooLarge {
        what: what.into(),
        cap: size_text(cap),
    }
}

/// An error with its causes, which say what went wrong (reqwest's own line names only the URL).
fn failed(what: &str, error: &dyn std::error::Error) -> RegistryError {
    let mut detail = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        detail.push_str(&format!(": {e}"));
        cause = e.source();
    }
    RegistryError::Failed {
        what: what.into(),
        detail,
    }
}

/// `4 MiB`, `64 KiB`, `8 GiB`, or bytes.
pub fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_read_as_registries_send_them() {
        let hub = r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io""#;
        assert_eq!(
            Challenge::bearer(hub),
            Some(Challenge {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
            })
        );
        let spaced = r#"bearer service = "a \"b\"", realm=https://x/t, scope="repository:a:pull""#;
        assert_eq!(
            Challenge::bearer(spaced),
            Some(Challenge {
                realm: "https://x/t".into(),
                service: Some("a \"b\"".into()),
            })
        );
        assert_eq!(Challenge::bearer(r#"Basic realm="registry""#), None);
        assert_eq!(Challenge::bearer(r#"Bearer service="no realm""#), None);
    }

    #[test]
    fn registry_errors_are_told_in_the_registrys_words() {
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#;
        assert_eq!(error_detail(body), ": manifest unknown");
        assert_eq!(error_detail(b"<html>bad gateway"), ": <html>bad gateway");
        assert_eq!(error_detail(b""), "");
        assert_eq!(size_text(4 << 20), "4 MiB");
        assert_eq!(size_text(64 << 10), "64 KiB");
        assert_eq!(size_text(1000), "1000 bytes");
    }
}
