//! The HTTP transport `object_store` uses when a signature needs the network: credentials
//! from an instance's metadata server, Google's `signBlob`, Azure's user delegation key. It
//! is the same hyper and rustls client as the transfers', so the tree carries one HTTP stack.

use http_body_util::BodyExt as _;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use object_store::client::{
    ClientOptions, HttpClient, HttpError, HttpErrorKind, HttpRequest, HttpRequestBody,
    HttpResponse, HttpResponseBody, HttpService,
};

/// Makes [`Hyper`] clients for `object_store`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Connector;

impl object_store::client::HttpConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let https = crate::transfer::https().map_err(|e| object_store::Error::Generic {
            store: "HTTP client",
            source: Box::new(e),
        })?;
        Ok(HttpClient::new(Hyper {
            client: HyperClient::builder(TokioExecutor::new()).build(https),
        }))
    }
}

/// One hyper client serving `object_store`'s requests.
struct Hyper {
    client: HyperClient<HttpsConnector<HttpConnector>, HttpRequestBody>,
}

impl std::fmt::Debug for Hyper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hyper").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl HttpService for Hyper {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let resp = self.client.request(req).await.map_err(|e| {
            let kind = if e.is_connect() {
                HttpErrorKind::Connect
            } else {
                HttpErrorKind::Request
            };
            HttpError::new(kind, e)
        })?;
        let (parts, body) = resp.into_parts();
        let body = body.map_err(|e| HttpError::new(HttpErrorKind::Decode, e));
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}
