//! The HTTP routes of the code-interpreter server (E2B's `template/server` protocol).

use super::contexts::{ApiError, Context, ContextInfo, Interpreter, SlotGuard};
use super::envcode;
use super::events::{self, Event, Output};
use super::kernel::RunEnd;
use super::kernelspec::normalize_language;
use crate::auth;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type Shared = Arc<Interpreter>;

pub fn router(interpreter: Shared) -> Router {
    let config = interpreter.config.clone();
    let routes = Router::new()
        .route("/health", get(|| async { "OK" }))
        .route("/execute", post(execute))
        .route("/contexts", get(list_contexts).post(create_context))
        .route("/contexts/{id}", delete(delete_context))
        .route("/contexts/{id}/restart", post(restart_context))
        .with_state(interpreter);
    auth::guard(routes, config, auth::Port::Interpreter)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, self.to_string()).into_response()
    }
}

/// Parses a JSON body; an empty body reads as `{}`.
fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("Invalid request: {e}")))
}

/// `POST /execute`. The SDK always sends all four keys, possibly null.
#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

/// Which context a run goes to.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Context(String),
    DefaultFor(String),
}

/// E2B's routing: an id or a language, not both; neither means the default Python context.
/// Empty strings count as absent (E2B tests truthiness).
fn route(context_id: Option<&str>, language: Option<&str>) -> Result<Target, ApiError> {
    let context_id = context_id.filter(|s| !s.is_empty());
    let language = language.filter(|s| !s.is_empty());
    match (context_id, language) {
        (Some(_), Some(_)) => Err(ApiError::BadRequest(
            "Only one of context_id or language can be provided".into(),
        )),
        (Some(id), None) => Ok(Target::Context(id.to_owned())),
        (None, language) => Ok(Target::DefaultFor(normalize_language(language))),
    }
}

async fn execute(State(interp): State<Shared>, body: Bytes) -> Response {
    match start_execution(interp, &body).await {
        Ok(body) => Response::new(body),
        Err(e) => e.into_response(),
    }
}

/// Resolves the context, waits for it to be free with a live kernel, then streams the run.
async fn start_execution(interp: Shared, body: &[u8]) -> Result<Body, ApiError> {
    let req: ExecuteRequest = parse_body(body)?;
    let ctx = match route(req.context_id.as_deref(), req.language.as_deref())? {
        Target::Context(id) => interp
            .get(&id)
            .ok_or_else(|| ApiError::NotFound(format!("Context {id} not found")))?,
        Target::DefaultFor(language) => interp.default_context(&language)?,
    };
    let per_run = req.env_vars.unwrap_or_default();
    let dialect = ctx.spec.dialect();
    for (name, value) in &per_run {
        envcode::check(dialect, name, value).map_err(ApiError::BadRequest)?;
    }

    let mut slot = ctx.lock().await;
    if ctx.is_deleted() {
        return Err(ApiError::NotFound(format!("Context {} not found", ctx.id)));
    }
    ctx.ensure_kernel(&mut slot, &interp.config)
        .await
        .map_err(|e| {
            ApiError::Internal(format!("Failed to start the {} kernel: {e}", ctx.language))
        })?;

    let (tx, rx) = mpsc::channel(events::LINE_BUFFER);
    // The run is its own task: it must go on (interrupt, drain, restore env) when the client
    // leaves and the response body is dropped.
    tokio::spawn(run(interp, ctx, slot, req.code, per_run, tx));
    Ok(Body::from_stream(
        ReceiverStream::new(rx).map(Ok::<_, Infallible>),
    ))
}

async fn run(
    interp: Shared,
    _ctx: Arc<Context>,
    mut slot: SlotGuard,
    code: String,
    per_run: BTreeMap<String, String>,
    tx: mpsc::Sender<Bytes>,
) {
    let mut out = Output::new(tx);
    let Some(kernel) = slot.kernel.as_mut() else {
        out.send(&Event::error("KernelDied", "The context has no kernel"))
            .await;
        out.send(&Event::EndOfExecution).await;
        return;
    };
    let globals = interp.config.current().env_vars;
    let identity = interp.config.identity();
    let end = kernel
        .execute(code, &globals, &per_run, identity, &mut out)
        .await;
    out.send(&Event::EndOfExecution).await;
    // Ends the response; the context stays locked until its env is restored.
    drop(out);
    match end {
        RunEnd::Done => kernel.restore_env(&per_run).await,
        RunEnd::KernelGone => slot.kernel = None,
    }
}

#[derive(Debug, Default, Deserialize)]
struct CreateContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    /// Who the kernel runs as (E2B's field; root unless named).
    #[serde(default)]
    user: Option<String>,
}

async fn create_context(
    State(interp): State<Shared>,
    body: Bytes,
) -> Result<Json<ContextInfo>, ApiError> {
    let req: CreateContext = parse_body(&body)?;
    let language = normalize_language(req.language.as_deref());
    let ctx = interp.new_context(&language, req.cwd.as_deref(), req.user.as_deref())?;
    let mut slot = ctx.lock().await;
    if let Err(e) = ctx.ensure_kernel(&mut slot, &interp.config).await {
        interp.remove(&ctx.id);
        return Err(ApiError::Internal(format!(
            "Failed to create the {language} context: {e}"
        )));
    }
    Ok(Json(ctx.info()))
}

async fn list_contexts(State(interp): State<Shared>) -> Json<Vec<ContextInfo>> {
    Json(interp.list())
}

async fn delete_context(
    State(interp): State<Shared>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let ctx = interp
        .remove(&id)
        .ok_or_else(|| ApiError::NotFound(format!("Context {id} not found")))?;
    ctx.delete().await;
    Ok(StatusCode::OK)
}

async fn restart_context(
    State(interp): State<Shared>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let ctx = interp
        .get(&id)
        .ok_or_else(|| ApiError::NotFound(format!("Context {id} not found")))?;
    ctx.restart(&interp.config)
        .await
        .map_err(|e| ApiError::Internal(format!("Failed to restart context {id}: {e}")))?;
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::interpreter::kernelspec::Kernelspecs;
    use airlock_wire::envd::InitRequest;
    use axum::http::Request;
    use tower::ServiceExt;

    #[test]
    fn routes_requests() {
        assert_eq!(
            route(None, None).unwrap(),
            Target::DefaultFor("python".into())
        );
        assert_eq!(
            route(Some(""), Some("")).unwrap(),
            Target::DefaultFor("python".into())
        );
        assert_eq!(
            route(None, Some("JS")).unwrap(),
            Target::DefaultFor("javascript".into())
        );
        assert_eq!(
            route(Some("abc"), None).unwrap(),
            Target::Context("abc".into())
        );
        assert!(matches!(
            route(Some("abc"), Some("python")),
            Err(ApiError::BadRequest(_))
        ));
    }

    #[test]
    fn parses_execute_bodies() {
        let r: ExecuteRequest =
            parse_body(br#"{"code":"1+1","context_id":null,"language":"js","env_vars":{"A":"B"}}"#)
                .unwrap();
        assert_eq!(r.code, "1+1");
        assert_eq!(r.language.as_deref(), Some("js"));
        assert_eq!(r.env_vars.unwrap()["A"], "B");
        assert!(parse_body::<ExecuteRequest>(b"").is_err());
        let c: CreateContext = parse_body(b"").unwrap();
        assert!(c.language.is_none() && c.cwd.is_none());
    }

    /// An interpreter whose only kernel (python) cannot start.
    fn broken_interpreter() -> (tempfile::TempDir, Shared) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("python3")).unwrap();
        std::fs::write(
            dir.path().join("python3/kernel.json"),
            r#"{"argv":["/nonexistent/python","{connection_file}"],"display_name":"x","language":"python"}"#,
        )
        .unwrap();
        let config = Arc::new(Config::default());
        config
            .apply_init(InitRequest {
                access_token: Some("tok".into()),
                default_user: Some("root".into()),
                default_workdir: Some("/".into()),
                ..Default::default()
            })
            .unwrap();
        let interp = Interpreter::new(config, Kernelspecs::load(dir.path()));
        (dir, interp)
    }

    async fn call(app: Router, req: Request<Body>) -> (StatusCode, String) {
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn post(uri: &str, body: &str, token: Option<&str>) -> Request<Body> {
        let mut req = Request::post(uri).header("content-type", "application/json");
        if let Some(token) = token {
            req = req.header("x-access-token", token);
        }
        req.body(Body::from(body.to_owned())).unwrap()
    }

    #[tokio::test]
    async fn answers_errors_before_streaming() {
        let (_dir, interp) = broken_interpreter();
        let app = router(interp);
        let run = r#"{"code":"1","context_id":null,"language":null,"env_vars":null}"#;

        let (status, body) = call(app.clone(), post("/execute", run, None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

        let both = r#"{"code":"1","context_id":"x","language":"python","env_vars":null}"#;
        let (status, body) = call(app.clone(), post("/execute", both, Some("tok"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body, "Only one of context_id or language can be provided");

        let unknown = r#"{"code":"1","context_id":"nope","language":null,"env_vars":null}"#;
        let (status, body) = call(app.clone(), post("/execute", unknown, Some("tok"))).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::NOT_FOUND, "Context nope not found")
        );

        let r = r#"{"code":"1","context_id":null,"language":"r","env_vars":null}"#;
        let (status, body) = call(app.clone(), post("/execute", r, Some("tok"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("Unsupported language 'r'"), "{body}");

        let bad_env = r#"{"code":"1","context_id":null,"language":null,"env_vars":{"A=B":"x"}}"#;
        let (status, _) = call(app.clone(), post("/execute", bad_env, Some("tok"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        // The kernel cannot start: 500 with the reason.
        let (status, body) = call(app.clone(), post("/execute", run, Some("tok"))).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("/nonexistent/python"), "{body}");

        let (status, body) = call(app.clone(), post("/contexts", "{}", Some("tok"))).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");

        let request = |method: &str, uri: &str, token: Option<&str>| {
            let mut req = Request::builder().method(method).uri(uri);
            if let Some(token) = token {
                req = req.header("x-access-token", token);
            }
            req.body(Body::empty()).unwrap()
        };
        for (method, uri) in [
            ("GET", "/contexts"),
            ("POST", "/contexts"),
            ("DELETE", "/contexts/nope"),
            ("POST", "/contexts/nope/restart"),
            ("GET", "/nosuchroute"),
        ] {
            let (status, _) = call(app.clone(), request(method, uri, None)).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} without a token"
            );
        }
        for (method, uri) in [
            ("DELETE", "/contexts/nope"),
            ("POST", "/contexts/nope/restart"),
        ] {
            let (status, body) = call(app.clone(), request(method, uri, Some("tok"))).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::NOT_FOUND, "Context nope not found")
            );
        }

        let req = Request::get("/health").body(Body::empty()).unwrap();
        assert_eq!(call(app.clone(), req).await, (StatusCode::OK, "OK".into()));

        // The default python context exists (its kernel failed), the failed new one does not.
        let (status, body) = call(app, request("GET", "/contexts", Some("tok"))).await;
        assert_eq!(status, StatusCode::OK);
        let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["language"], "python");
    }
}

/// Round trips through real kernels. Needs kernelspecs with a Python kernel (ipykernel) in
/// `$AIRLOCK_TEST_KERNELS_DIR`; runs them as root, the contexts' default user (so it needs root), e.g.
/// `AIRLOCK_TEST_KERNELS_DIR=/tmp/kernels cargo test -p airlock-agent -- --ignored real_kernel`.
#[cfg(test)]
mod real_kernel_tests {
    use super::*;
    use crate::config::Config;
    use crate::interpreter::kernelspec::Kernelspecs;
    use airlock_wire::envd::InitRequest;
    use axum::http::Request;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    async fn execute(app: &Router, body: Value) -> Vec<Value> {
        let req = Request::post("/execute")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(text.ends_with('\n') && !text.contains("\n\n"), "{text:?}");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn run(code: &str) -> Value {
        json!({"code": code, "context_id": null, "language": null, "env_vars": null})
    }

    #[tokio::test]
    #[ignore = "needs real Jupyter kernels in $AIRLOCK_TEST_KERNELS_DIR"]
    async fn real_kernel_round_trip() {
        let dir = std::env::var("AIRLOCK_TEST_KERNELS_DIR").expect("AIRLOCK_TEST_KERNELS_DIR");
        let specs = Kernelspecs::load(std::path::Path::new(&dir));
        let config = Arc::new(Config::default());
        config
            .apply_init(InitRequest {
                env_vars: [("GLOBAL_V".to_string(), "g".to_string())].into(),
                default_workdir: Some("/tmp".into()),
                ..Default::default()
            })
            .unwrap();
        let app = router(Interpreter::new(config, specs));

        let events = execute(&app, run("x = 1 + 1; x")).await;
        assert_eq!(events[0]["type"], "number_of_executions");
        let first = events[0]["execution_count"].as_i64().unwrap();
        assert!(events.contains(&json!({"type": "result", "text": "2", "is_main_result": true})));
        assert_eq!(events.last().unwrap(), &json!({"type": "end_of_execution"}));

        let events = execute(&app, run("print('hi'); x")).await;
        assert_eq!(events[0]["execution_count"].as_i64().unwrap(), first + 1);
        assert_eq!(events[1]["type"], "stdout");
        assert_eq!(events[1]["text"], "hi\n");
        assert!(events[1]["timestamp"].as_str().unwrap().ends_with("+00:00"));

        let events = execute(&app, run("1/0")).await;
        let error = events.iter().find(|e| e["type"] == "error").unwrap();
        assert_eq!(error["name"], "ZeroDivisionError");

        let mut with_env = run("import os; (os.environ['GLOBAL_V'], os.environ['RUN_V'])");
        with_env["env_vars"] = json!({"RUN_V": "it's \"r\"", "GLOBAL_V": "over"});
        let events = execute(&app, with_env).await;
        let result = events.iter().find(|e| e["type"] == "result").unwrap();
        assert_eq!(result["text"], json!("('over', 'it\\'s \"r\"')"));
        let events = execute(
            &app,
            run("import os; (os.environ['GLOBAL_V'], 'RUN_V' in os.environ)"),
        )
        .await;
        let result = events.iter().find(|e| e["type"] == "result").unwrap();
        assert_eq!(result["text"], "('g', False)");

        let events = execute(&app, run("import os; os._exit(1)")).await;
        assert!(
            events.iter().any(|e| e["name"] == "KernelDied"),
            "{events:?}"
        );
        let events = execute(&app, run("'x' in dir()")).await;
        let result = events.iter().find(|e| e["type"] == "result").unwrap();
        assert_eq!(result["text"], "False");
    }
}
