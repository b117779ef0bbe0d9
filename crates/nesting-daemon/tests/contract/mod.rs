//! A fake VMM API server that checks every request against the hypervisor's published API
//! description (`../shared/specs/*.yaml`): path and method exist, the JSON body validates
//! against the referenced schema (`$ref`, `required`, types, enums, bounds, and for Firecracker
//! no undeclared fields). Each request is recorded with its verdict; a violating request is
//! answered 400, as the real server would.
//!
//! The HTTP/1.1 side is a minimal hand-written parser (hyper's server is not among our
//! features): request line, headers, a `Content-Length` body, keep-alive.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use yaml_rust2::{Yaml, YamlLoader};

/// Where the published API descriptions live: `../shared/specs` beside the workspace.
pub fn specs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/specs")
}

/// Which OpenAPI generation a description is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Swagger 2.0 (Firecracker): body parameters, `#/definitions/X`.
    Swagger2,
    /// OpenAPI 3 (Cloud Hypervisor): `requestBody`, `#/components/schemas/X`.
    OpenApi3,
}

/// Path parameters by name, as found in a request path.
type Params = Vec<(String, String)>;

/// An operation of the description that a request maps to.
struct Operation<'a> {
    /// Its path template (`/drives/{drive_id}`).
    template: String,
    /// The operation object.
    op: &'a Yaml,
    /// Values of the template's parameters.
    params: Params,
}

/// One loaded API description.
#[derive(Debug)]
pub struct ApiSpec {
    /// The file it came from.
    pub file: PathBuf,
    doc: Yaml,
    dialect: Dialect,
    /// Path prefix of every operation (`/api/v1` for Cloud Hypervisor).
    base_path: String,
    /// Fields beyond the declared ones are an error (Firecracker's `deny_unknown_fields`).
    deny_unknown_fields: bool,
}

impl ApiSpec {
    /// Firecracker's description, or `None` (with a note) when the file is absent.
    pub fn firecracker() -> Option<Arc<ApiSpec>> {
        Self::load("firecracker-api.yaml", true)
    }

    /// Cloud Hypervisor's description, or `None` (with a note) when the file is absent.
    pub fn cloud_hypervisor() -> Option<Arc<ApiSpec>> {
        Self::load("cloud-hypervisor-api.yaml", false)
    }

    /// Load `name` from [`specs_dir`]; `None` and a `skipped:` line when it is absent.
    pub fn load(name: &str, deny_unknown_fields: bool) -> Option<Arc<ApiSpec>> {
        let file = specs_dir().join(name);
        let Ok(text) = std::fs::read_to_string(&file) else {
            println!("skipped: ../shared/specs/{name} not found");
            return None;
        };
        let doc = YamlLoader::load_from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not YAML: {e}", file.display()))
            .into_iter()
            .next()
            .expect("an API description document");
        let (dialect, base_path) = if doc["swagger"].as_str().is_some() {
            let base = doc["basePath"].as_str().unwrap_or("/");
            (Dialect::Swagger2, base.trim_end_matches('/').to_string())
        } else if doc["openapi"].as_str().is_some() {
            // `servers: [{url: http://localhost/api/v1}]` → `/api/v1`.
            let url = doc["servers"][0]["url"].as_str().unwrap_or("");
            let path = url
                .split_once("://")
                .map(|(_, rest)| rest.find('/').map_or("", |i| &rest[i..]))
                .unwrap_or(url);
            (Dialect::OpenApi3, path.trim_end_matches('/').to_string())
        } else {
            panic!("{}: neither swagger nor openapi", file.display());
        };
        Some(Arc::new(ApiSpec {
            file,
            doc,
            dialect,
            base_path,
            deny_unknown_fields,
        }))
    }

    /// The description's dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Find the operation for `method path`. Exact segments win over templated ones.
    fn operation(&self, method: &str, path: &str) -> Result<Operation<'_>, String> {
        let path = path.split('?').next().unwrap_or(path);
        let Some(rest) = path.strip_prefix(self.base_path.as_str()) else {
            return Err(format!(
                "{path} is outside the API's base path {}",
                self.base_path
            ));
        };
        let rest = if rest.is_empty() { "/" } else { rest };
        let segments: Vec<&str> = rest.split('/').collect();
        let paths = self.doc["paths"].as_hash().expect("paths");
        // (templated segments, template, path item, path parameters)
        let mut best: Option<(usize, String, &Yaml, Params)> = None;
        for (template, item) in paths {
            let Some(template) = template.as_str() else {
                continue;
            };
            let parts: Vec<&str> = template.split('/').collect();
            if parts.len() != segments.len() {
                continue;
            }
            let mut params = Vec::new();
            let mut templated = 0;
            let matched = parts.iter().zip(&segments).all(|(p, s)| {
                if let Some(name) = p.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                    templated += 1;
                    params.push((name.to_string(), (*s).to_string()));
                    !s.is_empty()
                } else {
                    p == s
                }
            });
            if matched && best.as_ref().is_none_or(|b| templated < b.0) {
                best = Some((templated, template.to_string(), item, params));
            }
        }
        let Some((_, template, item, params)) = best else {
            return Err(format!("{path}: no such path in {}", self.file_name()));
        };
        let op = &item[method.to_ascii_lowercase().as_str()];
        if op.is_badvalue() {
            return Err(format!(
                "{method} {path}: the API has no {method} on {template}"
            ));
        }
        Ok(Operation {
            template,
            op,
            params,
        })
    }

    fn file_name(&self) -> String {
        self.file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Everything wrong with a request (empty: it conforms).
    pub fn check(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let Operation {
            template,
            op,
            params,
        } = match self.operation(method, path) {
            Ok(found) => found,
            Err(e) => return vec![e],
        };
        let what = format!("{method} {template}");
        if body.is_some() && !content_type.is_some_and(|c| c.starts_with("application/json")) {
            out.push(format!(
                "{what}: body sent with Content-Type {content_type:?}, not application/json"
            ));
        }
        let (schema, required) = match self.dialect {
            Dialect::Swagger2 => {
                let mut schema = None;
                let mut required = false;
                for param in op["parameters"].as_vec().into_iter().flatten() {
                    let param = self.resolve(param);
                    match param["in"].as_str() {
                        Some("body") => {
                            schema = Some(&param["schema"]);
                            required = param["required"].as_bool().unwrap_or(false);
                        }
                        Some("path") => {
                            let name = param["name"].as_str().unwrap_or("");
                            if let Some((_, v)) = params.iter().find(|(n, _)| n == name) {
                                if param["type"].as_str() == Some("integer")
                                    && v.parse::<i64>().is_err()
                                {
                                    out.push(format!(
                                        "{what}: path parameter {name}={v:?} is not an integer"
                                    ));
                                }
                            } else if param["required"].as_bool().unwrap_or(false) {
                                out.push(format!("{what}: path parameter {name} missing"));
                            }
                        }
                        _ => {}
                    }
                }
                (schema, required)
            }
            Dialect::OpenApi3 => {
                let rb = self.resolve(&op["requestBody"]);
                if rb.is_badvalue() {
                    (None, false)
                } else {
                    let schema = &rb["content"]["application/json"]["schema"];
                    (
                        (!schema.is_badvalue()).then_some(schema),
                        rb["required"].as_bool().unwrap_or(false),
                    )
                }
            }
        };
        match (schema, body) {
            (None, Some(_)) => {
                out.push(format!("{what}: the operation takes no body, one was sent"))
            }
            (Some(_), None) if required => {
                out.push(format!("{what}: the required body is missing"))
            }
            (Some(schema), Some(body)) => {
                self.validate(schema, body, "body", &mut out);
                // A path id and the body's field of the same name must agree (Firecracker
                // refuses `PUT /drives/a` with `drive_id: "b"`).
                for (name, value) in &params {
                    if let Some(field) = body.get(name)
                        && field.as_str() != Some(value.as_str())
                    {
                        out.push(format!(
                            "{what}: path {name}={value:?} but body {name}={field}"
                        ));
                    }
                }
            }
            _ => {}
        }
        out.into_iter()
            .map(|v| format!("{method} {path}: {v}"))
            .collect()
    }

    /// Whether a canned answer of the fake conforms to the operation's response schema.
    pub fn check_response(
        &self,
        method: &str,
        path: &str,
        status: u16,
        body: &Value,
    ) -> Vec<String> {
        let op = match self.operation(method, path) {
            Ok(found) => found.op,
            Err(e) => return vec![e],
        };
        let response = &op["responses"][status as usize];
        let schema = match self.dialect {
            Dialect::Swagger2 => &response["schema"],
            Dialect::OpenApi3 => &response["content"]["application/json"]["schema"],
        };
        let mut out = Vec::new();
        if response.is_badvalue() {
            out.push(format!(
                "fake answers {method} {path} with undocumented status {status}"
            ));
        } else if !schema.is_badvalue() {
            self.validate(schema, body, "response", &mut out);
        }
        out
    }

    fn resolve<'a>(&'a self, node: &'a Yaml) -> &'a Yaml {
        let mut node = node;
        // References may chain (a schema that is only a `$ref`); bounded against cycles.
        for _ in 0..16 {
            let Some(reference) = node["$ref"].as_str() else {
                return node;
            };
            node = self.lookup(reference);
        }
        node
    }

    fn lookup(&self, reference: &str) -> &Yaml {
        let Some(pointer) = reference.strip_prefix("#/") else {
            return &Yaml::BadValue;
        };
        pointer
            .split('/')
            .map(|p| p.replace("~1", "/").replace("~0", "~"))
            .fold(&self.doc, |node, key| &node[key.as_str()])
    }

    fn validate(&self, schema: &Yaml, value: &Value, at: &str, out: &mut Vec<String>) {
        if let Some(reference) = schema["$ref"].as_str() {
            let target = self.lookup(reference);
            if target.is_badvalue() {
                out.push(format!(
                    "{at}: the description's $ref {reference} does not resolve"
                ));
                return;
            }
            // Swagger 2 and OpenAPI 3.0 ignore a `$ref`'s siblings (descriptions).
            return self.validate(target, value, at, out);
        }
        for part in schema["allOf"].as_vec().into_iter().flatten() {
            self.validate(part, value, at, out);
        }
        if value.is_null() && schema["nullable"].as_bool() == Some(true) {
            return;
        }
        if let Some(allowed) = schema["enum"].as_vec() {
            let ok = allowed.iter().any(|a| enum_matches(a, value));
            if !ok {
                let names: Vec<String> = allowed
                    .iter()
                    .map(|a| yaml_to_json(a).to_string())
                    .collect();
                out.push(format!(
                    "{at}: {value} is not one of [{}]",
                    names.join(", ")
                ));
            }
        }
        let ty = schema["type"]
            .as_str()
            .or_else(|| (!schema["properties"].is_badvalue()).then_some("object"));
        match ty {
            Some("object") => {
                let Some(map) = value.as_object() else {
                    out.push(format!("{at}: expected an object, got {value}"));
                    return;
                };
                for name in schema["required"].as_vec().into_iter().flatten() {
                    if let Some(name) = name.as_str()
                        && !map.contains_key(name)
                    {
                        out.push(format!("{at}: required field `{name}` is missing"));
                    }
                }
                let props = &schema["properties"];
                let extra = &schema["additionalProperties"];
                for (key, field) in map {
                    let prop = &props[key.as_str()];
                    if !prop.is_badvalue() {
                        self.validate(prop, field, &format!("{at}.{key}"), out);
                    } else if extra.as_hash().is_some() {
                        self.validate(extra, field, &format!("{at}.{key}"), out);
                    } else if extra.as_bool() == Some(false)
                        || (self.deny_unknown_fields && extra.is_badvalue())
                    {
                        out.push(format!("{at}: unknown field `{key}` (not in the schema)"));
                    }
                }
            }
            Some("array") => {
                let Some(items) = value.as_array() else {
                    out.push(format!("{at}: expected an array, got {value}"));
                    return;
                };
                if !schema["items"].is_badvalue() {
                    for (i, item) in items.iter().enumerate() {
                        self.validate(&schema["items"], item, &format!("{at}[{i}]"), out);
                    }
                }
            }
            Some("string") if !value.is_string() => {
                out.push(format!("{at}: expected a string, got {value}"));
            }
            Some("boolean") if !value.is_boolean() => {
                out.push(format!("{at}: expected a boolean, got {value}"));
            }
            Some("integer") => {
                if !(value.is_i64() || value.is_u64()) {
                    out.push(format!("{at}: expected an integer, got {value}"));
                    return;
                }
                check_bounds(schema, value, at, out);
                let n = value.as_i128();
                let range = match schema["format"].as_str() {
                    Some("uint8") => Some((0, i128::from(u8::MAX))),
                    Some("int16") => Some((i128::from(i16::MIN), i128::from(i16::MAX))),
                    Some("uint16") => Some((0, i128::from(u16::MAX))),
                    Some("int32") => Some((i128::from(i32::MIN), i128::from(i32::MAX))),
                    Some("uint32") => Some((0, i128::from(u32::MAX))),
                    Some("int64") => Some((i128::from(i64::MIN), i128::from(i64::MAX))),
                    Some("uint64") => Some((0, i128::from(u64::MAX))),
                    _ => None,
                };
                if let (Some((lo, hi)), Some(n)) = (range, n)
                    && !(lo..=hi).contains(&n)
                {
                    out.push(format!(
                        "{at}: {n} does not fit format {:?}",
                        schema["format"].as_str()
                    ));
                }
            }
            Some("number") => {
                if !value.is_number() {
                    out.push(format!("{at}: expected a number, got {value}"));
                    return;
                }
                check_bounds(schema, value, at, out);
            }
            _ => {}
        }
    }
}

trait AsI128 {
    fn as_i128(&self) -> Option<i128>;
}

impl AsI128 for Value {
    fn as_i128(&self) -> Option<i128> {
        self.as_i64()
            .map(i128::from)
            .or_else(|| self.as_u64().map(i128::from))
    }
}

fn check_bounds(schema: &Yaml, value: &Value, at: &str, out: &mut Vec<String>) {
    let Some(v) = value.as_f64() else { return };
    let bound = |y: &Yaml| y.as_i64().map(|i| i as f64).or_else(|| y.as_f64());
    if let Some(min) = bound(&schema["minimum"])
        && v < min
    {
        out.push(format!("{at}: {value} is below the minimum {min}"));
    }
    if let Some(max) = bound(&schema["maximum"])
        && v > max
    {
        out.push(format!("{at}: {value} is above the maximum {max}"));
    }
}

fn enum_matches(allowed: &Yaml, value: &Value) -> bool {
    let allowed = yaml_to_json(allowed);
    allowed == *value
        // YAML scalars like `2M` and `2` both describe what JSON sends as strings or numbers.
        || matches!((&allowed, value), (Value::Number(n), Value::String(s)) if n.to_string() == *s)
}

/// A YAML scalar or tree as JSON.
pub fn yaml_to_json(y: &Yaml) -> Value {
    match y {
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Real(s) => s
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(s.clone()), Value::Number),
        Yaml::Integer(i) => json!(i),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(a) => Value::Array(a.iter().map(yaml_to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (key, yaml_to_json(v))
                })
                .collect(),
        ),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

/// One request the fake received, with its verdict.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// HTTP method.
    pub method: String,
    /// Request target.
    pub path: String,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Parsed JSON body, if one was sent.
    pub body: Option<Value>,
    /// Status the fake answered.
    pub status: u16,
    /// Contract violations (empty: the request conforms).
    pub violations: Vec<String>,
}

impl Exchange {
    /// `METHOD path`.
    pub fn call(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Default)]
struct State {
    log: Vec<Exchange>,
    /// Answers to force for `METHOD path`: status and body text.
    forced: HashMap<String, (u16, String)>,
}

/// The fake server, bound to a unix socket until dropped.
#[derive(Debug)]
pub struct ContractServer {
    /// Its socket.
    pub socket: PathBuf,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl ContractServer {
    /// Serve `spec` on `socket` (its parent directory is created). Needs a tokio runtime.
    pub fn start(spec: Arc<ApiSpec>, socket: &Path) -> ContractServer {
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        let listener =
            UnixListener::bind(socket).unwrap_or_else(|e| panic!("bind {}: {e}", socket.display()));
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, spec.clone(), shared.clone()));
            }
        });
        ContractServer {
            socket: socket.to_path_buf(),
            state,
            task,
        }
    }

    /// Every exchange so far.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.state.lock().unwrap().log.clone()
    }

    /// Every exchange so far, forgetting them.
    pub fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut self.state.lock().unwrap().log)
    }

    /// `METHOD path` of every exchange so far.
    pub fn calls(&self) -> Vec<String> {
        self.exchanges().iter().map(Exchange::call).collect()
    }

    /// All violations so far.
    pub fn violations(&self) -> Vec<String> {
        self.exchanges()
            .into_iter()
            .flat_map(|e| e.violations)
            .collect()
    }

    /// Fail the test, listing every violation, if any request broke the contract.
    pub fn assert_conforms(&self) {
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "requests violating the published API:\n  {}",
            violations.join("\n  ")
        );
    }

    /// Answer `METHOD path` with `status` and `body` from now on (to test error handling).
    pub fn force(&self, method: &str, path: &str, status: u16, body: &str) {
        self.state
            .lock()
            .unwrap()
            .forced
            .insert(format!("{method} {path}"), (status, body.to_string()));
    }
}

impl Drop for ContractServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Canned answers for the GETs the backends make.
fn canned(spec: &ApiSpec, method: &str, path: &str) -> Option<Value> {
    if method != "GET" {
        return None;
    }
    let path = path.strip_prefix(spec.base_path.as_str()).unwrap_or(path);
    match (spec.dialect, path) {
        (Dialect::Swagger2, "/" | "") => Some(json!({
            "app_name": "Firecracker",
            "id": "anonymous-instance",
            "state": "Not started",
            "vmm_version": "1.17.0-dev",
        })),
        (Dialect::Swagger2, "/version") => Some(json!({ "firecracker_version": "1.17.0-dev" })),
        (Dialect::OpenApi3, "/vmm.ping") => Some(json!({
            "build_version": "v48.0.0-fake",
            "version": "48.0.0",
            "pid": std::process::id(),
            "features": ["kvm"],
        })),
        _ => None,
    }
}

async fn serve(mut stream: UnixStream, spec: Arc<ApiSpec>, state: Arc<Mutex<State>>) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut request_line = lines.next().unwrap_or("").split(' ');
        let method = request_line.next().unwrap_or("").to_string();
        let path = request_line.next().unwrap_or("").to_string();
        let version = request_line.next().unwrap_or("").to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let mut violations = Vec::new();
        if version != "HTTP/1.1" {
            violations.push(format!(
                "{method} {path}: request line says {version:?}, not HTTP/1.1"
            ));
        }
        if header("host").is_none() {
            violations.push(format!(
                "{method} {path}: no Host header (required by HTTP/1.1)"
            ));
        }
        let chunked = header("transfer-encoding").is_some_and(|t| t.contains("chunked"));
        if chunked {
            // Firecracker's micro_http has no chunked decoding; it needs Content-Length.
            violations.push(format!(
                "{method} {path}: chunked body instead of Content-Length"
            ));
        }
        let length: usize = header("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        let raw: Vec<u8> = buf.drain(..head_end + length).skip(head_end).collect();
        let body = if raw.is_empty() {
            None
        } else {
            match serde_json::from_slice::<Value>(&raw) {
                Ok(v) => Some(v),
                Err(e) => {
                    violations.push(format!("{method} {path}: body is not JSON ({e})"));
                    Some(Value::String(String::from_utf8_lossy(&raw).into_owned()))
                }
            }
        };
        if violations.is_empty() {
            violations = spec.check(
                &method,
                &path,
                header("content-type").as_deref(),
                body.as_ref(),
            );
        }

        let forced = state
            .lock()
            .unwrap()
            .forced
            .get(&format!("{method} {path}"))
            .cloned();
        let (status, content_type, reply) = if !violations.is_empty() {
            let message = violations.join("; ");
            match spec.dialect {
                Dialect::Swagger2 => (
                    400,
                    "application/json",
                    json!({ "fault_message": message }).to_string(),
                ),
                Dialect::OpenApi3 => (400, "text/plain", message),
            }
        } else if let Some((status, text)) = forced {
            let ct = if text.starts_with('{') {
                "application/json"
            } else {
                "text/plain"
            };
            (status, ct, text)
        } else if let Some(value) = canned(&spec, &method, &path) {
            violations.extend(spec.check_response(&method, &path, 200, &value));
            (200, "application/json", value.to_string())
        } else if method == "GET" {
            violations.push(format!("{method} {path}: the fake has no canned answer"));
            (404, "text/plain", "no canned answer".to_string())
        } else {
            (204, "", String::new())
        };

        state.lock().unwrap().log.push(Exchange {
            method: method.clone(),
            path: path.clone(),
            headers: headers.clone(),
            body,
            status,
            violations,
        });

        let reason = match status {
            200 => "OK",
            204 => "No Content",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Error",
        };
        let response = if status == 204 {
            "HTTP/1.1 204 No Content\r\n\r\n".to_string()
        } else {
            format!(
                "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{reply}",
                reply.len()
            )
        };
        if stream.write_all(response.as_bytes()).await.is_err() || chunked {
            return;
        }
        if header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
            return;
        }
    }
}
