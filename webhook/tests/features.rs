//! The features guard on real objects (a Pod as the API server sends it, a custom resource),
//! ratcheting, Feature validation through the router, and the lifecycle state machine.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use nodewarden_api::features::{
    ComponentReport, DesiredState, Feature, FeatureSpec, FeatureState, FeatureStatus, GateState,
    NodeFeatureReport, NodeFeatureReportSpec, OnDisable, OwnedField, ReadFailure, ResourceRef, TaskState,
};
use nodewarden_webhook::admission::{AdmissionRequest, Handler, Processed, process};
use nodewarden_webhook::features::lifecycle::{Action, Outcome, step, uses_summary};
use nodewarden_webhook::features::{
    Decision, FeatureCaches, FeaturesGuard, FeaturesObserver, MAX_WARNING, guard_index, review_owned,
};
use serde_json::{Value, json};

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/features/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn request(group: &str, resource: &str, kind: &str, object: &Value, old: Option<&Value>) -> AdmissionRequest {
    serde_json::from_value(json!({
        "uid": "5e1c7d3a-0000-4000-8000-000000000001",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "namespace": "shop",
        "name": object["metadata"]["name"],
        "operation": if old.is_some() { "UPDATE" } else { "CREATE" },
        "userInfo": {"username": "alice"},
        "object": object,
        "oldObject": old,
    }))
    .expect("request")
}

fn field(group: &str, resource: &str, path: &str, on_disable: OnDisable) -> OwnedField {
    OwnedField {
        group: group.into(),
        version: "v1".into(),
        resource: resource.into(),
        path: path.into(),
        on_disable,
    }
}

fn feature(
    name: &str,
    desired: DesiredState,
    state: Option<FeatureState>,
    fields: Vec<OwnedField>,
) -> Feature {
    let mut f = Feature::new(
        name,
        FeatureSpec {
            desired,
            gate: None,
            stage: None,
            default: None,
            components: vec!["kubelet".into()],
            fields,
            wait_for_absence: vec![],
        },
    );
    f.metadata.namespace = Some("kube-system".into());
    f.metadata.generation = Some(1);
    f.status = state.map(|state| FeatureStatus {
        state: Some(state),
        ..Default::default()
    });
    f
}

fn sidecars(state: Option<FeatureState>, desired: DesiredState, on_disable: OnDisable) -> Feature {
    feature(
        "SidecarContainers",
        desired,
        state,
        vec![field(
            "",
            "pods",
            "spec.initContainers[*].restartPolicy",
            on_disable,
        )],
    )
}

fn message(response: &nodewarden_webhook::admission::AdmissionResponse) -> String {
    response
        .status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

#[test]
fn a_sidecar_pod_is_denied_while_the_feature_is_off_or_turning_off() {
    let pod = fixture("pod-with-sidecar.json");
    for (state, desired) in [
        (Some(FeatureState::Off), DesiredState::Off),
        (Some(FeatureState::TurningOff), DesiredState::Off),
        // desired Off and no status yet counts as off
        (None, DesiredState::Off),
    ] {
        let index = guard_index([&sidecars(state, desired, OnDisable::Deny)]);
        let (response, decision) = review_owned(&request("", "pods", "Pod", &pod, None), &index);
        assert!(!response.allowed, "{state:?}");
        assert_eq!(decision, Decision::Denied);
        let m = message(&response);
        assert!(m.contains("kube-system/SidecarContainers"), "{m}");
        assert!(m.contains("spec.initContainers[*].restartPolicy"), "{m}");
        // the instance that is set (the second init container), and its value
        assert!(
            m.contains("spec.initContainers[1].restartPolicy = \"Always\""),
            "{m}"
        );
        assert_eq!(response.status.as_ref().and_then(|s| s.code), Some(403));
    }
}

#[test]
fn on_and_turning_on_features_guard_nothing() {
    let pod = fixture("pod-with-sidecar.json");
    for (state, desired) in [
        (Some(FeatureState::On), DesiredState::On),
        (Some(FeatureState::TurningOn), DesiredState::On),
        (None, DesiredState::On),
    ] {
        let index = guard_index([&sidecars(state, desired, OnDisable::Deny)]);
        let (response, decision) = review_owned(&request("", "pods", "Pod", &pod, None), &index);
        assert!(response.allowed, "{state:?}");
        assert_eq!(decision, Decision::Allowed);
    }
}

#[test]
fn a_pod_without_the_field_passes() {
    let mut pod = fixture("pod-with-sidecar.json");
    pod["spec"]["initContainers"][1]
        .as_object_mut()
        .unwrap()
        .remove("restartPolicy");
    let index = guard_index([&sidecars(
        Some(FeatureState::Off),
        DesiredState::Off,
        OnDisable::Deny,
    )]);
    let (response, _) = review_owned(&request("", "pods", "Pod", &pod, None), &index);
    assert!(response.allowed, "{}", message(&response));
}

#[test]
fn ratcheting_follows_the_api_servers_rule() {
    let widget = fixture("widget.json");
    let f = feature(
        "WidgetGlow",
        DesiredState::Off,
        Some(FeatureState::Off),
        vec![
            field(
                "example.nodewarden.io",
                "widgets",
                "spec.shades[*].tint.glow",
                OnDisable::Clear,
            ),
            field("example.nodewarden.io", "widgets", "spec.size", OnDisable::Deny),
        ],
    );
    let index = guard_index([&f]);
    let review = |new: &Value, old: Option<&Value>| {
        review_owned(
            &request("example.nodewarden.io", "widgets", "Widget", new, old),
            &index,
        )
    };

    // created with the field: denied, naming the instance
    let (r, _) = review(&widget, None);
    assert!(!r.allowed);
    let m = message(&r);
    assert!(
        m.contains("kube-system/WidgetGlow is Off") && m.contains("spec.shades[0].tint.glow = true"),
        "{m}"
    );
    assert!(m.contains("spec.size = 3"), "both fields are named: {m}");

    // an edit that keeps the fields, changes others: passes
    let mut edited = widget.clone();
    edited["spec"]["shades"][1]["tint"] = json!({"hue": 10});
    let (r, d) = review(&edited, Some(&widget));
    assert!(r.allowed, "{}", message(&r));
    assert_eq!(d, Decision::Ratcheted);

    // the old object used the field anywhere: a use at another index (or another value) passes too
    let mut moved = widget.clone();
    moved["spec"]["shades"][0]["tint"]
        .as_object_mut()
        .unwrap()
        .remove("glow");
    moved["spec"]["shades"][2]["tint"]["glow"] = json!(false);
    moved["spec"]["size"] = json!(4);
    let (r, _) = review(&moved, Some(&widget));
    assert!(r.allowed, "{}", message(&r));

    // an old object without the field: adding it is denied; the other field is per field
    let mut without = widget.clone();
    without["spec"]["shades"][0]["tint"]
        .as_object_mut()
        .unwrap()
        .remove("glow");
    let (r, _) = review(&widget, Some(&without));
    assert!(!r.allowed);
    let m = message(&r);
    assert!(
        m.contains("spec.shades[*].tint.glow") && !m.contains("spec.size ="),
        "{m}"
    );

    // removing the field is always fine
    let (r, _) = review(&without, Some(&widget));
    assert!(r.allowed);
}

#[test]
fn warn_admits_with_a_short_warning() {
    let widget = fixture("widget.json");
    let mut f = feature(
        "AVeryLongFeatureNameThatKeepsGoingAndGoingSoTheWarningWouldBeLongerThanTheLimit",
        DesiredState::Off,
        Some(FeatureState::TurningOff),
        vec![field(
            "example.nodewarden.io",
            "widgets",
            "spec.shades[*].tint.hue",
            OnDisable::Warn,
        )],
    );
    f.metadata.namespace = Some("a-third-party-namespace-with-a-long-name".into());
    let index = guard_index([&f]);
    let (r, d) = review_owned(
        &request("example.nodewarden.io", "widgets", "Widget", &widget, None),
        &index,
    );
    assert!(r.allowed);
    assert_eq!(d, Decision::Warned);
    assert_eq!(r.warnings.len(), 1);
    assert!(r.warnings[0].chars().count() <= MAX_WARNING, "{}", r.warnings[0]);
    assert!(
        r.warnings[0].starts_with("feature a-third-party-namespace"),
        "{}",
        r.warnings[0]
    );
}

#[test]
fn other_resources_and_groups_are_not_guarded() {
    let pod = fixture("pod-with-sidecar.json");
    let index = guard_index([&sidecars(
        Some(FeatureState::Off),
        DesiredState::Off,
        OnDisable::Deny,
    )]);
    // same resource name in another group
    let (r, _) = review_owned(&request("example.com", "pods", "Pod", &pod, None), &index);
    assert!(r.allowed);
}

#[derive(Default)]
struct Counted(std::sync::Mutex<Vec<Decision>>);
impl FeaturesObserver for Counted {
    fn decided(&self, d: Decision) {
        self.0.lock().expect("lock").push(d);
    }
}

fn review_body(request: &Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}),
    )
    .expect("JSON")
}

#[test]
fn feature_objects_with_invalid_paths_are_rejected_on_the_same_route() {
    let caches = FeatureCaches::new();
    let counted = Arc::new(Counted::default());
    let guard = FeaturesGuard::new(caches.clone()).with_observer(counted.clone());
    let bad = feature(
        "Broken",
        DesiredState::On,
        None,
        vec![
            field("", "pods", "spec.containers[0].name", OnDisable::Deny),
            field("", "pods", "spec..x", OnDisable::Deny),
            field("", "pods", "spec.ok", OnDisable::Deny),
        ],
    );
    let feature_request = |object: &Feature, old: Option<&Feature>| {
        json!({
            "uid": "u-1",
            "kind": {"group": "nodewarden.io", "version": "v1alpha1", "kind": "Feature"},
            "resource": {"group": "nodewarden.io", "version": "v1alpha1", "resource": "features"},
            "namespace": "kube-system",
            "operation": if old.is_some() { "UPDATE" } else { "CREATE" },
            "object": object,
            "oldObject": old,
        })
    };
    let Processed::Review(out, _, _) = process(&review_body(&feature_request(&bad, None)), &guard) else {
        panic!("not a review")
    };
    assert!(!out.response.allowed);
    let m = message(&out.response);
    assert!(m.contains("Feature kube-system/Broken is invalid"), "{m}");
    assert!(m.contains("spec.fields[0].path") && m.contains("only [*]"), "{m}");
    assert!(
        m.contains("spec.fields[1].path") && m.contains("no field name"),
        "{m}"
    );
    assert!(!m.contains("spec.fields[2]"), "{m}");

    // editing a Feature that was already invalid (written before the webhook ran) is allowed
    let mut edited = bad.clone();
    edited.spec.desired = DesiredState::Off;
    let Processed::Review(out, _, _) = process(&review_body(&feature_request(&edited, Some(&bad))), &guard)
    else {
        panic!("not a review")
    };
    assert!(out.response.allowed, "{}", message(&out.response));

    // the guard reads the caches: a Feature turned off there guards pods at once
    caches.apply_feature(sidecars(
        Some(FeatureState::Off),
        DesiredState::Off,
        OnDisable::Deny,
    ));
    let pod = fixture("pod-with-sidecar.json");
    let r = guard.review(&request("", "pods", "Pod", &pod, None));
    assert!(!r.allowed);
    assert_eq!(
        *counted.0.lock().unwrap(),
        vec![
            Decision::FeatureRejected,
            Decision::FeatureAccepted,
            Decision::Denied
        ]
    );
}

// ---- the state machine

fn t(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn report(node: &str, component: &str, enabled: Option<bool>, observed: &str) -> Arc<NodeFeatureReport> {
    let mut r = NodeFeatureReport::new(
        node,
        NodeFeatureReportSpec {
            components: vec![ComponentReport {
                name: component.into(),
                observed_time: Some(Time(t(observed))),
                error: None,
                error_reason: None,
                gates: enabled
                    .map(|enabled| {
                        vec![GateState {
                            name: "SidecarContainers".into(),
                            enabled,
                            stage: String::new(),
                        }]
                    })
                    .unwrap_or_default(),
            }],
        },
    );
    r.metadata.name = Some(node.into());
    Arc::new(r)
}

/// Applies a step's status to the feature, as the shell's write does.
fn advance(
    f: &mut Feature,
    reports: &[Arc<NodeFeatureReport>],
    outcome: Option<&Outcome>,
    now: &str,
) -> Option<Action> {
    let (status, action) = step(f, reports, outcome, t(now));
    // through JSON, as the API server stores it: a status must survive that unchanged, or the
    // controller would write it again on every step
    let stored: FeatureStatus =
        serde_json::from_value(serde_json::to_value(&status).expect("to JSON")).expect("from JSON");
    assert_eq!(stored, status, "status changes on a round trip");
    f.status = Some(stored);
    action
}

fn state(f: &Feature) -> FeatureState {
    f.status.as_ref().and_then(|s| s.state).expect("state")
}

#[test]
fn turning_off_waits_for_fresh_reports_then_clears_then_is_off() {
    let mut f = feature(
        "SidecarContainers",
        DesiredState::On,
        None,
        vec![
            field(
                "",
                "pods",
                "spec.initContainers[*].restartPolicy",
                OnDisable::Deny,
            ),
            field("example.nodewarden.io", "widgets", "spec.glow", OnDisable::Clear),
        ],
    );
    let on = [
        report("node-a", "kubelet", Some(true), "2026-11-21T08:00:00Z"),
        report("node-b", "kubelet", Some(true), "2026-11-21T08:00:00Z"),
    ];
    // a new Feature whose reports already agree is On at once (reports of any age count in
    // its first step)
    assert!(advance(&mut f, &on, None, "2026-11-21T08:30:00Z").is_none());
    assert_eq!(state(&f), FeatureState::On);
    assert_eq!(
        f.status.as_ref().unwrap().transition_time,
        None,
        "adopted, not a transition"
    );
    let adopted = f.status.clone();
    advance(&mut f, &on, None, "2026-11-21T08:31:00Z");
    assert_eq!(f.status, adopted, "the reports keep counting");
    // one that does not: TurningOn, and from then on reports must be fresh
    let off_then = [
        report("node-a", "kubelet", Some(false), "2026-11-21T08:00:00Z"),
        report("node-b", "kubelet", Some(true), "2026-11-21T08:00:00Z"),
    ];
    f.status = None;
    assert!(advance(&mut f, &off_then, None, "2026-11-21T08:30:00Z").is_none());
    assert_eq!(state(&f), FeatureState::TurningOn);
    assert!(advance(&mut f, &on, None, "2026-11-21T08:30:01Z").is_none());
    assert_eq!(
        state(&f),
        FeatureState::TurningOn,
        "old reports do not count any more"
    );
    let on = [
        report("node-a", "kubelet", Some(true), "2026-11-21T08:30:00Z"),
        report("node-b", "kubelet", Some(true), "2026-11-21T08:30:05Z"),
    ];
    assert!(advance(&mut f, &on, None, "2026-11-21T08:30:06Z").is_none());
    assert_eq!(
        state(&f),
        FeatureState::TurningOn,
        "nor those from the second it started in"
    );
    let on = [
        report("node-a", "kubelet", Some(true), "2026-11-21T08:30:05Z"),
        report("node-b", "kubelet", Some(true), "2026-11-21T08:30:05Z"),
    ];
    assert!(advance(&mut f, &on, None, "2026-11-21T08:30:06Z").is_none());
    assert_eq!(state(&f), FeatureState::On);
    assert_eq!(
        f.status.as_ref().unwrap().uses_summary.as_deref(),
        Some("kubelet 2/2 on")
    );

    // desired Off: TurningOff with its tasks, in order
    f.spec.desired = DesiredState::Off;
    let action = advance(&mut f, &on, None, "2026-11-21T09:00:00Z");
    assert!(action.is_none());
    let status = f.status.clone().unwrap();
    assert_eq!(status.state, Some(FeatureState::TurningOff));
    assert_eq!(status.transition_time, Some(Time(t("2026-11-21T09:00:00Z"))));
    let names: Vec<_> = status.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "WaitForReports",
            "ClearField widgets.example.nodewarden.io/spec.glow"
        ]
    );
    // the old reports are stale now
    assert_eq!(status.uses_summary.as_deref(), Some("kubelet 0/2 off (2 stale)"));
    let settled = status.conditions.iter().find(|c| c.type_ == "Settled").unwrap();
    assert_eq!(settled.status, "False");
    assert!(
        settled.message.contains("node-a (kubelet no fresh report)"),
        "{}",
        settled.message
    );

    // node-a reports off after the transition started, node-b still on: still waiting
    let partly = [
        report("node-a", "kubelet", Some(false), "2026-11-21T09:01:00Z"),
        report("node-b", "kubelet", Some(true), "2026-11-21T09:01:00Z"),
    ];
    assert!(advance(&mut f, &partly, None, "2026-11-21T09:01:00Z").is_none());
    assert_eq!(state(&f), FeatureState::TurningOff);
    assert_eq!(
        f.status.as_ref().unwrap().uses_summary.as_deref(),
        Some("kubelet 1/2 off")
    );
    let uses = &f.status.as_ref().unwrap().uses[0];
    assert_eq!((uses.enabled, uses.disabled, uses.stale), (1, 1, 0));

    // a report observed before the transition does not count, even if it says off
    let old_off = [
        report("node-a", "kubelet", Some(false), "2026-11-21T09:01:00Z"),
        report("node-b", "kubelet", Some(false), "2026-11-21T08:59:00Z"),
    ];
    assert!(advance(&mut f, &old_off, None, "2026-11-21T09:01:30Z").is_none());
    assert_eq!(f.status.as_ref().unwrap().tasks[0].state, TaskState::Running);

    // both fresh and off (node-b's kubelet no longer knows the gate: off): clearing starts
    let off = [
        report("node-a", "kubelet", Some(false), "2026-11-21T09:01:00Z"),
        report("node-b", "kubelet", None, "2026-11-21T09:02:00Z"),
    ];
    let action = advance(&mut f, &off, None, "2026-11-21T09:02:00Z");
    let task = "ClearField widgets.example.nodewarden.io/spec.glow".to_string();
    match &action {
        Some(Action::ClearPage {
            task: name,
            continue_token: None,
            field,
        }) => {
            assert_eq!(name, &task);
            assert_eq!(field.path, "spec.glow");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(f.status.as_ref().unwrap().tasks[0].state, TaskState::Done);

    // a page done with a continue token: the token is kept in the status (a restart resumes)
    let action = advance(
        &mut f,
        &off,
        Some(&Outcome::Cleared {
            task: task.clone(),
            next: Some("tok-2".into()),
            cleared: 100,
        }),
        "2026-11-21T09:02:05Z",
    );
    assert_eq!(
        f.status.as_ref().unwrap().tasks[1].progress.as_deref(),
        Some("tok-2")
    );
    assert!(matches!(action, Some(Action::ClearPage { continue_token: Some(ref c), .. }) if c == "tok-2"));
    // a restart: no outcome, the same page again
    let restarted = advance(&mut f, &off, None, "2026-11-21T09:02:06Z");
    assert_eq!(restarted, action);
    // an expired token: from the start
    let action = advance(
        &mut f,
        &off,
        Some(&Outcome::Expired { task: task.clone() }),
        "2026-11-21T09:02:07Z",
    );
    assert!(matches!(
        action,
        Some(Action::ClearPage {
            continue_token: None,
            ..
        })
    ));
    // a failure is shown and retried
    let action = advance(
        &mut f,
        &off,
        Some(&Outcome::Failed {
            task: task.clone(),
            message: "forbidden".into(),
        }),
        "2026-11-21T09:02:08Z",
    );
    assert!(action.is_some());
    assert_eq!(
        f.status.as_ref().unwrap().tasks[1].message.as_deref(),
        Some("forbidden")
    );
    // the last page: Off
    let action = advance(
        &mut f,
        &off,
        Some(&Outcome::Cleared {
            task: task.clone(),
            next: None,
            cleared: 7,
        }),
        "2026-11-21T09:03:00Z",
    );
    assert!(action.is_none());
    let status = f.status.clone().unwrap();
    assert_eq!(status.state, Some(FeatureState::Off));
    assert!(status.tasks.iter().all(|t| t.state == TaskState::Done));
    assert_eq!(status.transition_time, Some(Time(t("2026-11-21T09:00:00Z"))));
    assert_eq!(status.uses_summary.as_deref(), Some("kubelet 2/2 off"));
    assert_eq!(
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "Settled")
            .unwrap()
            .status,
        "True"
    );

    // steady: another step changes nothing
    let before = f.status.clone();
    assert!(advance(&mut f, &off, None, "2026-11-21T09:10:00Z").is_none());
    assert_eq!(f.status, before);

    // back On: TurningOn waits for reports showing enabled, and has no clear task
    f.spec.desired = DesiredState::On;
    advance(&mut f, &off, None, "2026-11-21T10:00:00Z");
    assert_eq!(state(&f), FeatureState::TurningOn);
    assert_eq!(f.status.as_ref().unwrap().tasks.len(), 1);
    let back_on = [
        report("node-a", "kubelet", Some(true), "2026-11-21T10:00:30Z"),
        report("node-b", "kubelet", Some(true), "2026-11-21T10:00:31Z"),
    ];
    advance(&mut f, &back_on, None, "2026-11-21T10:01:00Z");
    assert_eq!(state(&f), FeatureState::On);
}

#[test]
fn turning_off_reversed_midway_and_wait_for_absence() {
    let mut f = feature("VolumeKind", DesiredState::Off, Some(FeatureState::On), vec![]);
    f.spec.wait_for_absence = vec![ResourceRef {
        group: "example.nodewarden.io".into(),
        version: "v1".into(),
        resource: "gizmos".into(),
    }];
    // no node reports the gate at all: reports are not waited for
    let action = advance(&mut f, &[], None, "2026-11-21T09:00:00Z");
    let task = "WaitForAbsence gizmos.example.nodewarden.io".to_string();
    assert_eq!(
        action,
        Some(Action::CountObjects {
            task: task.clone(),
            resource: f.spec.wait_for_absence[0].clone()
        })
    );
    assert_eq!(
        f.status.as_ref().unwrap().uses_summary.as_deref(),
        Some("kubelet 0/0 off")
    );
    advance(
        &mut f,
        &[],
        Some(&Outcome::Remaining {
            task: task.clone(),
            count: 2,
        }),
        "2026-11-21T09:00:01Z",
    );
    assert_eq!(state(&f), FeatureState::TurningOff);
    assert!(
        f.status.as_ref().unwrap().tasks[1]
            .message
            .as_deref()
            .unwrap()
            .contains("2 objects left")
    );
    // reversed while turning off: TurningOn, a new transition
    f.spec.desired = DesiredState::On;
    let action = advance(&mut f, &[], None, "2026-11-21T09:00:02Z");
    assert!(action.is_none());
    assert_eq!(
        state(&f),
        FeatureState::On,
        "no node reports, nothing to wait for"
    );
    assert_eq!(
        f.status.as_ref().unwrap().transition_time,
        Some(Time(t("2026-11-21T09:00:02Z")))
    );
    // and Off again, with the objects gone
    f.spec.desired = DesiredState::Off;
    advance(&mut f, &[], None, "2026-11-21T09:01:00Z");
    advance(
        &mut f,
        &[],
        Some(&Outcome::Remaining { task, count: 0 }),
        "2026-11-21T09:01:01Z",
    );
    assert_eq!(state(&f), FeatureState::Off);
}

#[test]
fn unreadable_and_missing_components_hold_a_transition() {
    let mut f = feature(
        "SidecarContainers",
        DesiredState::Off,
        Some(FeatureState::On),
        vec![],
    );
    f.spec.components = vec!["kubelet".into(), "kube-proxy".into()];
    let mut broken = (*report("node-a", "kubelet", None, "2026-11-21T09:05:00Z")).clone();
    broken.spec.components[0].error = Some("connection refused".into());
    let reports = [
        Arc::new(broken),
        report("node-b", "kubelet", Some(false), "2026-11-21T09:05:00Z"),
    ];
    advance(&mut f, &reports, None, "2026-11-21T09:00:00Z");
    advance(&mut f, &reports, None, "2026-11-21T09:06:00Z");
    assert_eq!(state(&f), FeatureState::TurningOff);
    let status = f.status.as_ref().unwrap();
    assert_eq!(
        status.uses_summary.as_deref(),
        Some("kubelet 1/2 off (1 stale), kube-proxy 0/2 off (2 stale)")
    );
    let message = status.tasks[0].message.clone().unwrap();
    assert!(message.contains("node-a (kubelet no fresh report)"), "{message}");
    assert!(
        message.contains("node-b (kube-proxy no fresh report)"),
        "{message}"
    );
}

/// A node whose agent could not verify its kubelet's serving certificate (a self-signed one).
fn unverified(node: &str) -> Arc<NodeFeatureReport> {
    let mut r = (*report(node, "kubelet", None, "2026-11-21T09:05:00Z")).clone();
    r.spec.components[0].error = Some("GET /metrics: invalid peer certificate: UnknownIssuer".into());
    r.spec.components[0].error_reason = Some(ReadFailure::CertificateNotVerified);
    Arc::new(r)
}

fn settled_message(f: &Feature) -> String {
    f.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Settled"))
        .map(|c| c.message.clone())
        .expect("a Settled condition")
}

#[test]
fn unverifiable_kubelets_are_named_with_the_setting_that_fixes_them() {
    let mut f = feature(
        "SidecarContainers",
        DesiredState::Off,
        Some(FeatureState::On),
        vec![],
    );
    let reports = [
        unverified("node-a"),
        unverified("node-b"),
        report("node-c", "kubelet", Some(true), "2026-11-21T09:05:00Z"),
        report("node-d", "kubelet", Some(false), "2026-11-21T09:05:00Z"),
    ];
    advance(&mut f, &reports, None, "2026-11-21T09:00:00Z");
    advance(&mut f, &reports, None, "2026-11-21T09:06:00Z");
    assert_eq!(state(&f), FeatureState::TurningOff, "the transition waits");
    let message = settled_message(&f);
    assert!(
        message.starts_with(
            "WaitForReports: the kubelet serving certificate of 2 node(s) cannot be verified: node-a, node-b;"
        ),
        "{message}"
    );
    for setting in [
        "agent.kubelet.caFile",
        "serverTLSBootstrap: true",
        "agent.kubelet.insecureSkipVerify=true",
    ] {
        assert!(message.contains(setting), "{setting} missing: {message}");
    }
    // the other nodes are still listed as before, the unverified ones only once
    assert!(
        message.ends_with("waiting for node-c (kubelet reports on)"),
        "{message}"
    );
    assert!(!message.contains("node-a (kubelet"), "{message}");
    let status = f.status.as_ref().expect("status");
    assert_eq!(status.uses_summary.as_deref(), Some("kubelet 1/4 off (2 stale)"));

    // a kubelet that could not be read for another reason is no certificate problem
    let mut refused = (*unverified("node-a")).clone();
    refused.spec.components[0].error_reason = Some(ReadFailure::Forbidden);
    advance(&mut f, &[Arc::new(refused)], None, "2026-11-21T09:07:00Z");
    let message = settled_message(&f);
    assert_eq!(
        message,
        "WaitForReports: waiting for node-a (kubelet no fresh report)"
    );

    // once they are verified and report the gate off, the Feature is Off
    let fixed = [
        report("node-a", "kubelet", Some(false), "2026-11-21T09:08:00Z"),
        report("node-b", "kubelet", Some(false), "2026-11-21T09:08:00Z"),
    ];
    advance(&mut f, &fixed, None, "2026-11-21T09:09:00Z");
    assert_eq!(state(&f), FeatureState::Off);
}

#[test]
fn many_unverifiable_kubelets_are_counted_past_the_first_five() {
    let mut f = feature(
        "SidecarContainers",
        DesiredState::On,
        Some(FeatureState::Off),
        vec![],
    );
    let reports: Vec<Arc<NodeFeatureReport>> = (0..12).map(|i| unverified(&format!("node-{i:02}"))).collect();
    advance(&mut f, &reports, None, "2026-11-21T09:00:00Z");
    let message = settled_message(&f);
    assert!(
        message.starts_with(
            "WaitForReports: the kubelet serving certificate of 12 node(s) cannot be verified: \
             node-00, node-01, node-02, node-03, node-04 and 7 more; give the agent the CA"
        ),
        "{message}"
    );
    assert!(!message.contains("node-05"), "{message}");
    assert!(
        !message.contains("waiting for"),
        "nobody else is waited for: {message}"
    );
    assert!(message.len() < 600, "{} bytes: {message}", message.len());
}

#[test]
fn summary_reads_at_a_glance() {
    use nodewarden_api::features::ComponentUses;
    let uses = vec![ComponentUses {
        component: "kubelet".into(),
        enabled: 0,
        disabled: 3,
        stale: 0,
    }];
    assert_eq!(uses_summary(&uses, DesiredState::Off), "kubelet 3/3 off");
    assert_eq!(uses_summary(&uses, DesiredState::On), "kubelet 0/3 on");
    assert_eq!(uses_summary(&[], DesiredState::On), "no reports");
}
