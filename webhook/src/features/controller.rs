//! The Feature lifecycle controller (KEP-3920), run by the leader: the I/O shell around the pure
//! decision in [`super::lifecycle`].
//!
//! [`run`] is a kube-runtime `Controller` on the Features: it reconciles a Feature
//! when it changes, when any node report changes (the reports come from the webhook's cache),
//! every resync interval, and every [`BUSY_REQUEUE`] while an action is under way; it calls
//! [`step`], writes `status` by server-side apply when it changed, runs the actions (list and
//! patch pages of objects at a bounded rate, count objects), keeps each Feature's last outcome
//! for its next step, and retries a failed Feature with its own backoff
//! (`controllers::ObjectBackoff`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action as ControllerAction;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use nodewarden_api::features::{Feature, FeatureStatus, OwnedField};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::lifecycle::*;
use super::{FeatureCaches, FeaturesObserver, FieldPath, feature_key};
use crate::controllers::{
    self, LeaderTask, ReconcileError, ReconcileObserver, Reconciler, Reconciling, leader_task,
};
use crate::events;

/// Settings of the controller.
#[derive(Clone, Debug)]
pub struct FeaturesOptions {
    /// Objects per page (and per patch burst) of a `ClearField` task.
    pub clear_page_size: u32,
    /// Most objects patched per second by `ClearField` tasks.
    pub clear_rate: u32,
    /// How often every Feature is looked at, besides on changes.
    pub resync_interval: Duration,
}

impl Default for FeaturesOptions {
    fn default() -> Self {
        FeaturesOptions {
            clear_page_size: 100,
            clear_rate: 50,
            resync_interval: Duration::from_secs(10),
        }
    }
}

/// Name of the lifecycle controller (the `controller` label of the reconcile metrics).
pub const CONTROLLER: &str = "features";
/// How soon a Feature whose action is under way is stepped again.
pub const BUSY_REQUEUE: Duration = Duration::from_millis(200);
/// Node report changes reconcile every Feature at most this often (changes in between are
/// taken together).
pub const REPORTS_GAP: Duration = Duration::from_secs(1);
/// Reconciliations of different Features run at once at most.
const CONCURRENCY: u16 = 4;

/// The controller as a leader task.
pub fn task(
    caches: Arc<FeatureCaches>,
    options: FeaturesOptions,
    observer: Option<Arc<dyn FeaturesObserver>>,
    reconciles: Option<Arc<dyn ReconcileObserver>>,
) -> LeaderTask {
    leader_task(move |client, stop| {
        run(
            client,
            caches.clone(),
            options.clone(),
            observer.clone(),
            reconciles.clone(),
            stop,
        )
    })
}

/// Why a reconciliation of a Feature failed; it is retried with the Feature's own backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The status could not be written.
    #[error("writing the status of Feature {feature}: {source}")]
    WriteStatus {
        /// The Feature's name.
        feature: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The current task's action failed (its message is in the task too).
    #[error("{task}: {message}")]
    Action {
        /// The task's name.
        task: String,
        /// Why it failed.
        message: String,
    },
}

impl ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::WriteStatus { .. } => "write-status",
            Error::Action { .. } => "action",
        }
    }
}

/// A status the controller wrote, which its watch may not have brought back yet.
struct Written {
    feature: Arc<Feature>,
    /// Resource versions the write replaced: while the watch shows one of them, this is newer.
    replaces: Vec<String>,
}

/// The statuses the controller wrote, per Feature (namespace/name), so that the next step starts
/// from them even when the controller's watch has not brought them back yet (a step on the older
/// object would start the same transition again, with a second Event).
#[derive(Default)]
struct OwnWrites(HashMap<String, Written>);

impl OwnWrites {
    /// Most resource versions kept per Feature: only a few writes ever outrun the watch.
    const KEPT: usize = 8;

    /// The newer of `watched` (from the watch) and the last status written.
    fn latest(&mut self, key: &str, watched: Arc<Feature>) -> Arc<Feature> {
        if let Some(w) = self.0.get(key) {
            if watched
                .resource_version()
                .is_some_and(|rv| w.replaces.contains(&rv))
            {
                return w.feature.clone();
            }
            // the watch has caught up (or someone else wrote since): it is the newest
            self.0.remove(key);
        }
        watched
    }

    /// `written` is what writing a status over `read` gave back.
    fn wrote(&mut self, key: &str, read: &Feature, written: Feature) {
        let mut replaces = self.0.remove(key).map(|w| w.replaces).unwrap_or_default();
        replaces.extend(read.resource_version());
        if replaces.len() > Self::KEPT {
            replaces.drain(..replaces.len() - Self::KEPT);
        }
        self.0.insert(
            key.to_string(),
            Written {
                feature: Arc::new(written),
                replaces,
            },
        );
    }

    fn retain(&mut self, live: &HashSet<String>) {
        self.0.retain(|key, _| live.contains(key));
    }
}

/// What the reconciler of every Feature shares.
struct Context {
    client: Client,
    caches: Arc<FeatureCaches>,
    options: FeaturesOptions,
    observer: Option<Arc<dyn FeaturesObserver>>,
    recorder: Recorder,
    reconciling: Reconciling,
    /// The controller's own watch of the Features (to forget Features that are gone).
    store: Store<Feature>,
    /// The outcome of each Feature's last action, by namespace/name, for its next step.
    outcomes: Mutex<HashMap<String, Outcome>>,
    /// The last status written per Feature.
    written: Mutex<OwnWrites>,
    /// When the next page of a `ClearField` task may start: the bound of `clear_rate`, shared by
    /// every Feature.
    next_page: Mutex<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Context {
    /// Forgets what is kept for Features that are gone.
    fn forget_deleted(&self) {
        let live: HashSet<String> = self.store.state().iter().map(|f| feature_key(f)).collect();
        lock(&self.outcomes).retain(|key, _| live.contains(key));
        lock(&self.written).retain(&live);
    }

    /// Takes the turn for one page of a `ClearField` task, or says how long until there is one.
    fn take_page_turn(&self) -> Result<(), Duration> {
        let mut next = lock(&self.next_page);
        let now = Instant::now();
        if now < *next {
            return Err(*next - now);
        }
        // held for a whole page until it is done
        *next = now + self.pause_for(self.options.clear_page_size as usize);
        Ok(())
    }

    /// A page has been done with `cleared` objects patched: the next one waits so long.
    fn page_done(&self, cleared: usize) -> Duration {
        let pause = self.pause_for(cleared);
        *lock(&self.next_page) = Instant::now() + pause;
        pause
    }

    fn pause_for(&self, objects: usize) -> Duration {
        Duration::from_secs_f64(objects as f64 / f64::from(self.options.clear_rate.max(1)))
    }
}

/// The I/O shell: a kube-runtime `Controller` on the Features that, while `stop` is not
/// cancelled, steps a Feature on each change of it, on each change of the node reports, every
/// resync interval, and again shortly while an action is under way; it writes the statuses,
/// runs the actions, and retries a failed Feature with its own backoff.
pub async fn run(
    client: Client,
    caches: Arc<FeatureCaches>,
    options: FeaturesOptions,
    observer: Option<Arc<dyn FeaturesObserver>>,
    reconciles: Option<Arc<dyn ReconcileObserver>>,
    stop: CancellationToken,
) {
    let (synced, reports) = (caches.clone(), caches.clone());
    controllers::start(
        client,
        stop,
        async move { synced.wait_synced().await },
        CONCURRENCY,
        // from once the caches are filled on
        move |controller| controller.reconcile_all_on(reports.report_changes(REPORTS_GAP)),
        |client, store| Context {
            recorder: events::recorder(&client),
            client,
            caches,
            options,
            observer,
            reconciling: Reconciling::new(CONTROLLER, reconciles),
            store,
            outcomes: Mutex::default(),
            written: Mutex::default(),
            next_page: Mutex::new(Instant::now()),
        },
    )
    .await;
}

impl Reconciler<Feature> for Context {
    type Error = Error;

    fn reconciling(&self) -> &Reconciling {
        &self.reconciling
    }

    async fn reconcile(
        self: Arc<Self>,
        key: String,
        watched: Arc<Feature>,
    ) -> Result<ControllerAction, Error> {
        reconcile_feature(&key, watched, &self).await
    }
}

async fn reconcile_feature(
    key: &str,
    watched: Arc<Feature>,
    context: &Context,
) -> Result<ControllerAction, Error> {
    context.forget_deleted();
    let feature = lock(&context.written).latest(key, watched);
    let reports = context.caches.reports();
    let outcome = lock(&context.outcomes).remove(key);
    let (status, action) = step(&feature, &reports, outcome.as_ref(), Timestamp::now());
    if differs(feature.status.as_ref(), &status) {
        let before = feature.status.as_ref().and_then(|s| s.state);
        let written = match write_status(&context.client, &feature, &status).await {
            Ok(written) => written,
            Err(source) => {
                // the next step must still see what the last action came to
                if let Some(outcome) = outcome {
                    lock(&context.outcomes).insert(key.to_string(), outcome);
                }
                return Err(Error::WriteStatus {
                    feature: key.to_string(),
                    source,
                });
            }
        };
        // the next step must see this status even before the watch brings it, and so must the
        // guard
        lock(&context.written).wrote(key, &feature, written.clone());
        context.caches.apply_feature(written);
        if before != status.state
            && let Some(state) = status.state
        {
            if let Some(observer) = &context.observer {
                observer.transitioned(state);
            }
            let (reason, note) = transition_event(before, state, feature.spec.desired);
            events::publish(
                &context.recorder,
                &feature.object_ref(&()),
                false,
                "Transition",
                reason,
                note,
            )
            .await;
            tracing::info!(feature = %key, state = ?status.state, "feature state");
        }
    }
    let Some(action) = action else {
        return Ok(ControllerAction::requeue(context.options.resync_interval));
    };
    let clearing = matches!(action, Action::ClearPage { .. });
    if clearing && let Err(wait) = context.take_page_turn() {
        return Ok(ControllerAction::requeue(wait));
    }
    let outcome = execute(&context.client, &action, &context.options).await;
    let mut next = BUSY_REQUEUE;
    if clearing {
        let cleared = match &outcome {
            Outcome::Cleared { cleared, .. } => *cleared,
            _ => 0,
        };
        next = next.max(context.page_done(cleared));
    }
    let failed = match &outcome {
        Outcome::Failed { task, message } => Some(Error::Action {
            task: task.clone(),
            message: message.clone(),
        }),
        _ => None,
    };
    lock(&context.outcomes).insert(key.to_string(), outcome);
    match failed {
        Some(err) => Err(err),
        None => Ok(ControllerAction::requeue(next)),
    }
}

async fn write_status(
    client: &Client,
    feature: &Feature,
    status: &FeatureStatus,
) -> Result<Feature, kube::Error> {
    let api: Api<Feature> = Api::namespaced(client.clone(), &feature.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "Feature",
        "status": status,
    });
    api.patch_status(
        &feature.name_any(),
        &PatchParams::apply(crate::controllers::FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
}

fn api_resource(group: &str, version: &str, resource: &str) -> ApiResource {
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: String::new(),
        plural: resource.to_string(),
    }
}

/// Runs one action against the API server.
pub async fn execute(client: &Client, action: &Action, options: &FeaturesOptions) -> Outcome {
    match action {
        Action::CountObjects { task, resource } => {
            let ar = api_resource(&resource.group, &resource.version, &resource.resource);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            match api.list_metadata(&ListParams::default().limit(1)).await {
                Ok(list) => {
                    let more = list.metadata.remaining_item_count.unwrap_or(0);
                    let count = list.items.len() + usize::try_from(more).unwrap_or(0);
                    Outcome::Remaining {
                        task: task.clone(),
                        count,
                    }
                }
                Err(err) => Outcome::Failed {
                    task: task.clone(),
                    message: format!("listing {}: {err}", resource.resource),
                },
            }
        }
        Action::ClearPage {
            task,
            field,
            continue_token,
        } => clear_page(client, task, field, continue_token.as_deref(), options).await,
    }
}

async fn clear_page(
    client: &Client,
    task: &str,
    field: &OwnedField,
    continue_token: Option<&str>,
    options: &FeaturesOptions,
) -> Outcome {
    let failed = |message: String| Outcome::Failed {
        task: task.to_string(),
        message,
    };
    let path = match FieldPath::parse(&field.path) {
        Ok(p) => p,
        Err(err) => return failed(err.to_string()),
    };
    let ar = api_resource(&field.group, &field.version, &field.resource);
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut params = ListParams::default().limit(options.clear_page_size.max(1));
    if let Some(token) = continue_token {
        params = params.continue_token(token);
    }
    let page = match all.list(&params).await {
        Ok(page) => page,
        Err(kube::Error::Api(status)) if status.code == 410 => {
            return Outcome::Expired {
                task: task.to_string(),
            };
        }
        Err(err) => return failed(format!("listing {}: {err}", field.resource)),
    };
    let mut cleared = 0;
    for object in &page.items {
        let Ok(value) = serde_json::to_value(object) else {
            continue;
        };
        let instances = path.instances(&value);
        if instances.is_empty() {
            continue;
        }
        let api: Api<DynamicObject> = match object.namespace() {
            Some(ns) => Api::namespaced_with(client.clone(), &ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let name = object.name_any();
        let mut result = remove_field(&api, &value, &path).await;
        if matches!(&result, Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422) {
            // changed since the list: read it again and retry once
            result = match api.get_opt(&name).await {
                Ok(Some(fresh)) => match serde_json::to_value(&fresh) {
                    Ok(fresh) => remove_field(&api, &fresh, &path).await,
                    Err(_) => Ok(false),
                },
                Ok(None) => Ok(false),
                Err(err) => Err(err),
            };
        }
        match result {
            Ok(true) => cleared += 1,
            Ok(false) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(err) => {
                return failed(format!(
                    "removing {} from {}/{}: {err}",
                    field.path,
                    object.namespace().unwrap_or_default(),
                    name
                ));
            }
        }
    }
    let next = page.metadata.continue_.filter(|t| !t.is_empty());
    Outcome::Cleared {
        task: task.to_string(),
        next,
        cleared,
    }
}

/// Removes every instance of `path` from `object` (as read) with one JSON patch, guarded by its
/// resourceVersion. `Ok(false)`: nothing to remove.
async fn remove_field(
    api: &Api<DynamicObject>,
    object: &Value,
    path: &FieldPath,
) -> Result<bool, kube::Error> {
    let instances = path.instances(object);
    if instances.is_empty() {
        return Ok(false);
    }
    let mut ops: Vec<Value> = Vec::new();
    if let Some(rv) = object.pointer("/metadata/resourceVersion") {
        ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}));
    }
    // the last instance first, so list indexes stay right
    for instance in instances.iter().rev() {
        ops.push(json!({"op": "remove", "path": instance.pointer}));
    }
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await?;
    Ok(true)
}

/// Whether two statuses differ in anything but the time of a condition that did not change.
fn differs(a: Option<&FeatureStatus>, b: &FeatureStatus) -> bool {
    a != Some(b)
}

#[cfg(test)]
mod tests {
    use nodewarden_api::features::{DesiredState, FeatureState};

    use super::*;

    /// Each kind of error has its label, and a failed reconciliation is counted under it.
    #[test]
    fn each_error_kind_is_counted_under_its_label() {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let reconciling = Reconciling::new(CONTROLLER, Some(metrics.clone()));
        let kinds = [
            (
                Error::WriteStatus {
                    feature: "glow".to_string(),
                    source: kube::Error::TlsRequired,
                },
                "write-status",
            ),
            (
                Error::Action {
                    task: "clear spec.glow".to_string(),
                    message: "forbidden".to_string(),
                },
                "action",
            ),
        ];
        for (error, label) in &kinds {
            assert_eq!(error.metric_label(), *label, "{error}");
            reconciling.retry("shop/glow", error);
            let text = metrics.encode();
            let series = format!(
                "nodewarden_controller_reconcile_errors_total{{controller=\"features\",error=\"{label}\"}} 1"
            );
            assert!(text.contains(&series), "{series} not in\n{text}");
        }
    }

    fn at(rv: &str, state: Option<FeatureState>) -> Feature {
        let mut f = Feature::new(
            "glow",
            nodewarden_api::features::FeatureSpec {
                desired: DesiredState::Off,
                gate: None,
                stage: None,
                default: None,
                components: vec![],
                fields: vec![],
                wait_for_absence: vec![],
            },
        );
        f.metadata.namespace = Some("shop".into());
        f.metadata.resource_version = Some(rv.into());
        f.status = state.map(|state| FeatureStatus {
            state: Some(state),
            ..Default::default()
        });
        f
    }

    fn state_of(f: &Feature) -> Option<FeatureState> {
        f.status.as_ref().and_then(|s| s.state)
    }

    #[test]
    fn a_step_starts_from_its_own_write_until_the_watch_brings_it() {
        let mut own = OwnWrites::default();
        let key = "shop/glow";
        let on = Arc::new(at("10", Some(FeatureState::On)));
        // first look: nothing written yet, the watch's object is it
        assert_eq!(
            own.latest(key, on.clone()).resource_version().as_deref(),
            Some("10")
        );
        // the transition is written (10 → 11); a report change steps the Feature again before the
        // watch has brought 11: the step must see TurningOff, not start the transition over
        let turning_off = at("11", Some(FeatureState::TurningOff));
        own.wrote(key, &on, turning_off.clone());
        let seen = own.latest(key, on.clone());
        assert_eq!(state_of(&seen), Some(FeatureState::TurningOff));
        // a second write on top of the first (11 → 12), the watch still at 10
        own.wrote(key, &seen, at("12", Some(FeatureState::Off)));
        assert_eq!(state_of(&own.latest(key, on.clone())), Some(FeatureState::Off));
        // the watch shows 11, older than the last write: still the write
        assert_eq!(
            state_of(&own.latest(key, Arc::new(turning_off))),
            Some(FeatureState::Off)
        );
        // the watch catches up (12) or moves past (a user's edit, 13): the watch wins from then on
        let edited = Arc::new(at("13", Some(FeatureState::Off)));
        assert_eq!(
            own.latest(key, edited.clone()).resource_version().as_deref(),
            Some("13")
        );
        assert_eq!(
            own.latest(key, on).resource_version().as_deref(),
            Some("10"),
            "nothing kept once the watch caught up"
        );
        // and a deleted Feature is forgotten
        own.wrote(key, &edited, at("14", Some(FeatureState::Off)));
        own.retain(&HashSet::new());
        assert!(own.0.is_empty());
    }

    #[test]
    fn a_transition_event_names_the_state_entered_and_where_it_came_from() {
        let (reason, note) = transition_event(
            Some(FeatureState::On),
            FeatureState::TurningOff,
            DesiredState::Off,
        );
        assert_eq!(reason, "TurningOff");
        assert_eq!(note, "On → TurningOff (desired Off)");
        let (reason, note) = transition_event(None, FeatureState::TurningOn, DesiredState::On);
        assert_eq!(
            (reason, note.as_str()),
            ("TurningOn", "no state → TurningOn (desired On)")
        );
    }
}
