//! Every response the S3 client reads is bounded before anything parses it. object_store
//! reads manifests, leases, listing pages and error bodies whole into memory (a listing page
//! and an error body inside the client, out of this crate's reach), so the bound sits in the
//! HTTP layer: [`Connector`] wraps object_store's reqwest client and refuses a response whose
//! `Content-Length` is over `remote.max_response_bytes`, and stops reading one that grows
//! past it without saying its length. The one exception is the body of a successful blob GET
//! (`…/blobs/sha256/<digest>`): [`super::fetch`] streams it to disk and stops at the size
//! the signed manifest states.

use std::future::Future;
use std::pin::Pin;

use http_body_util::{BodyExt, LengthLimitError, Limited};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// A response over `remote.max_response_bytes`.
#[derive(Debug)]
pub struct TooLarge {
    /// The request's path (`/BUCKET/PREFIX/manifests/<key>`, or the bucket for a listing).
    pub object: String,
    pub limit: u64,
    /// The length the server announced, when it announced one.
    pub claimed: Option<u64>,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = match self.claimed {
            Some(n) => format!("{n} bytes"),
            None => "longer".into(),
        };
        write!(
            f,
            "{}: the response is {size}, over remote.max_response_bytes ({} bytes); nothing of it was parsed",
            self.object, self.limit
        )
    }
}

impl std::error::Error for TooLarge {}

/// object_store's reqwest connector with every response bounded (see the module docs).
#[derive(Debug)]
pub(super) struct Connector {
    pub limit: u64,
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Bounded {
            inner,
            limit: self.limit,
        }))
    }
}

#[derive(Debug)]
struct Bounded {
    inner: HttpClient,
    limit: u64,
}

/// Whether a request is a blob download, whose successful body is bounded by its manifest.
fn streamed(req: &HttpRequest) -> bool {
    req.method().as_str() == "GET" && req.uri().path().contains("/blobs/sha256/")
}

impl Bounded {
    async fn bounded(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let blob = streamed(&req);
        let object = req.uri().path().to_string();
        let res = self.inner.execute(req).await?;
        if blob && res.status().is_success() {
            return Ok(res);
        }
        let limit = self.limit;
        let claimed = res
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if claimed.is_some_and(|n| n > limit) {
            return Err(HttpError::new(
                HttpErrorKind::Decode,
                TooLarge {
                    object,
                    limit,
                    claimed,
                },
            ));
        }
        let (parts, body) = res.into_parts();
        let body =
            Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)).map_err(move |e| {
                if e.is::<LengthLimitError>() {
                    return HttpError::new(
                        HttpErrorKind::Decode,
                        TooLarge {
                            object: object.clone(),
                            limit,
                            claimed: None,
                        },
                    );
                }
                match e.downcast::<HttpError>() {
                    Ok(h) => *h,
                    Err(other) => HttpError::new_boxed(HttpErrorKind::Unknown, other),
                }
            });
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

impl HttpService for Bounded {
    // The `async_trait` signature, written out (the trait is declared with it).
    fn call<'s, 'f>(
        &'s self,
        req: HttpRequest,
    ) -> Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'f>>
    where
        's: 'f,
        Self: 'f,
    {
        Box::pin(self.bounded(req))
    }
}

/// The [`TooLarge`] among an error's causes, if any.
pub(super) fn too_large<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a TooLarge> {
    let mut src: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(t) = s.downcast_ref::<TooLarge>() {
            return Some(t);
        }
        src = s.source();
    }
    None
}
