//! The HTTP side: one POST per query (the query in a form body, so long selectors fit), read
//! within the time and size limits, and the answer's JSON turned into [`Series`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use crate::{Endpoint, Error, Limits, Series};

/// A client of one Prometheus server's HTTP API, with its limits.
#[derive(Clone)]
pub struct Prometheus {
    endpoint: Endpoint,
    base: String,
    limits: Limits,
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// The largest answer's body so far, in bytes (shared by clones).
    largest: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus")
            .field("url", &self.base)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// `{"status": "success" | "error", "data": …, "errorType": …, "error": …}`
#[derive(Deserialize)]
struct Answer<T> {
    status: String,
    data: Option<T>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Matrix {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<RawSeries>,
}

#[derive(Deserialize)]
struct RawSeries {
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Points,
}

/// A series' `values`, `[[<seconds>, "<value>"], …]`, decoded straight into `(ms, value)`: no
/// string per point is kept (a point costs 16 bytes decoded, against about 28 in the answer),
/// so an answer's peak while decoding is its body and its points, not a multiple of the body.
/// Points whose time or value is not a finite number are left out.
#[derive(Default)]
struct Points(Vec<(i64, f64)>);

impl<'de> Deserialize<'de> for Points {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Points;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of [time, \"value\"] pairs")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Points, A::Error> {
                // the hint is the answer's own word: never reserve more than a page can hold
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(Point(p)) = seq.next_element()? {
                    out.extend(p);
                }
                Ok(Points(out))
            }
        }
        d.deserialize_seq(Visit)
    }
}

/// One `[<seconds>, "<value>"]`, `None` when either is not a finite number.
struct Point(Option<(i64, f64)>);

impl<'de> Deserialize<'de> for Point {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (t, v): (f64, std::borrow::Cow<'de, str>) = Deserialize::deserialize(d)?;
        let value: f64 = v.parse().unwrap_or(f64::NAN);
        // times are whole milliseconds in Prometheus
        #[allow(clippy::cast_possible_truncation)]
        let ms = (t * 1000.0).round() as i64;
        Ok(Point((value.is_finite() && t.is_finite()).then_some((ms, value))))
    }
}

fn file_error(what: &'static str, path: &std::path::Path, reason: impl ToString) -> Error {
    Error::File {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Seconds since the Unix epoch, as Prometheus reads a time.
fn seconds(ms: i64) -> String {
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

/// The first `n` characters of an answer, for an error message.
fn excerpt(body: &[u8], n: usize) -> String {
    String::from_utf8_lossy(body).trim().chars().take(n).collect()
}

impl Prometheus {
    /// A client for `endpoint`; checks the URL and reads the CA file (the token file is read
    /// for every query).
    pub fn new(endpoint: Endpoint, limits: Limits) -> Result<Self, Error> {
        let bad = |reason: &str| Error::BadUrl {
            url: endpoint.url.clone(),
            reason: reason.to_string(),
        };
        let uri: Uri = endpoint
            .url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(bad("it must start with http:// or https://")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("it has no host"));
        }
        if uri.query().is_some() {
            return Err(bad("it must not have a query (?…)"));
        }
        let base = endpoint.url.trim_end_matches('/').to_string();

        let mut roots = rustls::RootCertStore::empty();
        match &endpoint.ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| file_error("CA file", path, e))?;
                for cert in rustls_pemfile::certs(&mut &pem[..]) {
                    let cert = cert.map_err(|e| file_error("CA file", path, e))?;
                    roots.add(cert).map_err(|e| file_error("CA file", path, e))?;
                }
                if roots.is_empty() {
                    return Err(file_error("CA file", path, "holds no PEM certificate"));
                }
            }
            None => {
                // the system's roots; ones that cannot be read are skipped, as curl does
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&format!("TLS set-up: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(limits.query_timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Prometheus {
            endpoint,
            base,
            limits,
            http,
            largest: Arc::default(),
        })
    }

    /// The limits every query keeps to.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The size of the largest answer read so far, in bytes: what [`Limits::max_response_bytes`]
    /// must leave room for.
    pub fn largest_answer(&self) -> usize {
        self.largest.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The base URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// `query` evaluated every `step` from `start_ms` to `end_ms` (both in milliseconds since
    /// the Unix epoch), in pages of at most [`Limits::steps_per_page`] steps. Series with the
    /// same labels in several pages are joined; series come ordered by their labels.
    pub async fn query_range(
        &self,
        query: &str,
        start_ms: i64,
        end_ms: i64,
        step: Duration,
    ) -> Result<Vec<Series>, Error> {
        let step_ms = i64::try_from(step.as_millis()).unwrap_or(i64::MAX).max(1);
        let per_page = i64::try_from(self.limits.steps_per_page()).unwrap_or(i64::MAX);
        let mut joined: BTreeMap<BTreeMap<String, String>, Vec<(i64, f64)>> = BTreeMap::new();
        // points gathered so far, against `max_points_per_read`
        let mut held = 0usize;
        let mut page_start = start_ms;
        while page_start <= end_ms {
            let page_end = page_start
                .saturating_add(step_ms.saturating_mul(per_page - 1))
                .min(end_ms);
            let form = form_urlencoded::Serializer::new(String::new())
                .append_pair("query", query)
                .append_pair("start", &seconds(page_start))
                .append_pair("end", &seconds(page_end))
                .append_pair("step", &seconds(step_ms))
                .append_pair("timeout", &format!("{}ms", self.limits.query_timeout.as_millis()))
                .finish();
            let body = self.post("/api/v1/query_range", form, query).await?;
            let answer: Answer<Matrix> =
                serde_json::from_slice(&body).map_err(|e| self.bad_answer(query, e))?;
            let data = answer
                .data
                .filter(|_| answer.status == "success")
                .ok_or_else(|| self.bad_answer(query, answer.error.unwrap_or_else(|| "no data".into())))?;
            if data.result_type != "matrix" {
                return Err(self.bad_answer(
                    query,
                    format!("resultType {} (a range query gives a matrix)", data.result_type),
                ));
            }
            if data.result.len() > self.limits.max_series {
                return Err(Error::TooManySeries {
                    query: query.to_string(),
                    count: data.result.len(),
                    limit: self.limits.max_series,
                });
            }
            for raw in data.result {
                held = held.saturating_add(raw.values.0.len());
                if held > self.limits.max_points_per_read {
                    return Err(Error::TooManyPoints {
                        query: query.to_string(),
                        limit: self.limits.max_points_per_read,
                    });
                }
                let points = joined.entry(raw.metric).or_default();
                if points.is_empty() {
                    *points = raw.values.0;
                } else {
                    points.extend(raw.values.0);
                }
            }
            if joined.len() > self.limits.max_series {
                return Err(Error::TooManySeries {
                    query: query.to_string(),
                    count: joined.len(),
                    limit: self.limits.max_series,
                });
            }
            page_start = page_end.saturating_add(step_ms);
        }
        Ok(joined
            .into_iter()
            .map(|(labels, mut points)| {
                points.sort_by_key(|p| p.0);
                points.dedup_by_key(|p| p.0);
                // the pages' growth can leave up to half of the buffer unused
                points.shrink_to_fit();
                Series { labels, points }
            })
            .collect())
    }

    /// Whether Prometheus holds any series named `name` between `start_ms` and `end_ms`
    /// (`/api/v1/series` with `limit=1`; a server too old for `limit` answers with every
    /// such series, within [`Limits::max_response_bytes`]).
    pub async fn has_series(&self, name: &str, start_ms: i64, end_ms: i64) -> Result<bool, Error> {
        let query = format!("{{__name__=\"{name}\"}}");
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("match[]", &query)
            .append_pair("start", &seconds(start_ms))
            .append_pair("end", &seconds(end_ms))
            .append_pair("limit", "1")
            .finish();
        let body = self.post("/api/v1/series", form, &query).await?;
        let answer: Answer<Vec<serde::de::IgnoredAny>> =
            serde_json::from_slice(&body).map_err(|e| self.bad_answer(&query, e))?;
        match answer.data {
            Some(list) if answer.status == "success" => Ok(!list.is_empty()),
            _ => Err(self.bad_answer(&query, answer.error.unwrap_or_else(|| "no data".into()))),
        }
    }

    fn bad_answer(&self, query: &str, reason: impl ToString) -> Error {
        Error::BadAnswer {
            url: self.base.clone(),
            query: query.to_string(),
            reason: reason.to_string(),
        }
    }

    /// One POST of `form` to `path`, within the timeout and size limit; the body of a 2xx answer.
    async fn post(&self, path: &str, form: String, query: &str) -> Result<Bytes, Error> {
        let mut request = Request::post(format!("{}{path}", self.base))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json");
        if let Some(path) = &self.endpoint.bearer_token_file {
            let token =
                std::fs::read_to_string(path).map_err(|e| file_error("bearer token file", path, e))?;
            let token = token.trim();
            if token.is_empty() {
                return Err(file_error("bearer token file", path, "is empty"));
            }
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| self.bad_answer(query, format!("building the request: {e}")))?;
        let limit = self.limits.max_response_bytes;
        let exchange = async {
            let response = self.http.request(request).await.map_err(|e| Error::Unreachable {
                url: self.base.clone(),
                reason: crate::error_chain(&e),
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        Error::TooLarge {
                            url: self.base.clone(),
                            query: query.to_string(),
                            limit,
                        }
                    } else {
                        Error::Unreachable {
                            url: self.base.clone(),
                            reason: format!("reading the answer: {e}"),
                        }
                    }
                })?
                .to_bytes();
            Ok::<_, Error>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.limits.query_timeout, exchange)
            .await
            .map_err(|_| Error::Timeout {
                url: self.base.clone(),
                timeout: self.limits.query_timeout,
                query: query.to_string(),
            })??;
        self.largest
            .fetch_max(body.len(), std::sync::atomic::Ordering::Relaxed);
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(Error::Unauthorized {
                url: self.base.clone(),
                status: status.as_u16(),
                detail: excerpt(&body, 200),
            });
        }
        if !status.is_success() {
            let detail = serde_json::from_slice::<Answer<serde::de::IgnoredAny>>(&body)
                .ok()
                .and_then(|a| a.error)
                .unwrap_or_else(|| excerpt(&body, 300));
            return Err(Error::Query {
                url: self.base.clone(),
                status: status.as_u16(),
                query: query.to_string(),
                detail,
            });
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_seconds_with_milliseconds() {
        assert_eq!(seconds(1_700_000_000_123), "1700000000.123");
        assert_eq!(seconds(60_000), "60.000");
        assert_eq!(seconds(-1), "-1.999");
    }

    #[test]
    fn urls_are_checked() {
        let endpoint = |url: &str| Endpoint {
            url: url.to_string(),
            bearer_token_file: None,
            ca_file: None,
        };
        for bad in [
            "prometheus:9090",
            "ftp://x",
            "http://",
            "http://x/?a=b",
            "not a url",
        ] {
            let err = Prometheus::new(endpoint(bad), Limits::default()).expect_err(bad);
            assert!(matches!(err, Error::BadUrl { .. }), "{bad}: {err}");
        }
        let p = Prometheus::new(endpoint("http://127.0.0.1:9090/prefix/"), Limits::default()).unwrap();
        assert_eq!(p.url(), "http://127.0.0.1:9090/prefix");
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let err = Prometheus::new(
            Endpoint {
                url: "https://127.0.0.1:9090".into(),
                bearer_token_file: None,
                ca_file: Some("/nonexistent/ca.pem".into()),
            },
            Limits::default(),
        )
        .expect_err("missing file");
        assert!(
            err.to_string().starts_with("CA file /nonexistent/ca.pem: "),
            "{err}"
        );
    }

    /// A server on a free loopback port that answers every request with `answer` (after
    /// reading its head), or never answers when `answer` is `None`; the requests it read.
    async fn canned(answer: Option<String>) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answer = answer.clone();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    log.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                    match answer {
                        Some(a) => {
                            let _ = stream.write_all(a.as_bytes()).await;
                        }
                        None => tokio::time::sleep(Duration::from_secs(30)).await,
                    }
                });
            }
        });
        (url, seen)
    }

    fn http(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    fn client(url: &str, limits: Limits) -> Prometheus {
        Prometheus::new(
            Endpoint {
                url: url.to_string(),
                bearer_token_file: None,
                ca_file: None,
            },
            limits,
        )
        .unwrap()
    }

    const MATRIX: &str = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{"pod":"a"},"values":[[60,"1.5"],[120,"NaN"],[180,"2"]]}]}}"#;

    #[tokio::test]
    async fn a_matrix_is_read_and_long_windows_are_paged() {
        let (url, seen) = canned(Some(http("200 OK", MATRIX))).await;
        let limits = Limits {
            max_points_per_series: 10,
            ..Limits::default()
        };
        let p = client(&url, limits);
        // 30 steps of 60 s: three pages of 10 steps
        let series = p
            .query_range("up", 60_000, 60_000 * 30, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(series.len(), 1);
        // the same points in every page: joined, NaN left out
        assert_eq!(series[0].points, vec![(60_000, 1.5), (180_000, 2.0)]);
        assert_eq!(p.largest_answer(), MATRIX.len());
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 3, "{seen:?}");
            assert!(seen[0].starts_with("POST /api/v1/query_range "), "{}", seen[0]);
            assert!(
                seen[1].contains("start=660.000&end=1200.000&step=60.000"),
                "{}",
                seen[1]
            );
        }
        // two points a page: the third page goes over a limit of 5 points in all
        let p = client(
            &url,
            Limits {
                max_points_per_read: 5,
                ..limits
            },
        );
        let err = p
            .query_range("up", 60_000, 60_000 * 30, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::TooManyPoints { limit: 5, .. }), "{err:?}");
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        let (url, _) = canned(None).await;
        let limits = Limits {
            query_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let err = client(&url, limits)
            .query_range("up", 0, 0, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
    }

    #[tokio::test]
    async fn answers_over_the_size_limit_or_not_json_are_refused() {
        let (url, _) = canned(Some(http("200 OK", MATRIX))).await;
        let limits = Limits {
            max_response_bytes: 50,
            ..Limits::default()
        };
        let err = client(&url, limits)
            .query_range("up", 0, 0, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::TooLarge { limit: 50, .. }), "{err:?}");
        assert!(err.to_string().contains("larger than 50 bytes"), "{err}");
        let (url, _) = canned(Some(http("200 OK", "<html>a login page</html>"))).await;
        let err = client(&url, Limits::default())
            .query_range("up", 0, 0, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::BadAnswer { .. }), "{err}");
    }

    #[tokio::test]
    async fn prometheus_errors_and_401_say_what_happened() {
        let body = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        let (url, _) = canned(Some(http("400 Bad Request", body))).await;
        let err = client(&url, Limits::default())
            .query_range("up{", 0, 0, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("Prometheus at {url} answered HTTP 400 to up{{: parse error at char 3")
        );
        let (url, _) = canned(Some(http("401 Unauthorized", "Unauthorized"))).await;
        let err = client(&url, Limits::default())
            .has_series("up", 0, 0)
            .await
            .unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "Prometheus at {url} refused the query: HTTP 401 (Unauthorized)"
            )),
            "{err}"
        );
    }

    #[tokio::test]
    async fn too_many_series_is_an_error() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"pod":"a"},"values":[]},{"metric":{"pod":"b"},"values":[]}]}}"#;
        let (url, _) = canned(Some(http("200 OK", body))).await;
        let limits = Limits {
            max_series: 1,
            ..Limits::default()
        };
        let err = client(&url, limits)
            .query_range("up", 0, 0, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::TooManySeries {
                    count: 2,
                    limit: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn pages_fit_the_series_limit() {
        let limits = Limits::default();
        assert_eq!(limits.steps_per_page(), 1000);
        let few = Limits {
            max_series: 10,
            ..Limits::default()
        };
        assert_eq!(few.steps_per_page(), 10_000);
    }
}
