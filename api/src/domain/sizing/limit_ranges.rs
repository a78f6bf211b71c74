//! The LimitRanges of the pod's namespace: their items by type, and the tightest bound of each.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use crate::quantity::amount;
use crate::rightsizing::ResourceName;
use k8s_openapi::api::core::v1::{LimitRange, LimitRangeItem};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The LimitRanges of `namespace` among `all` (LimitRanges bind only the pods of their own
/// namespace): what the decision takes, for callers that hold every namespace's (the agent's
/// watch, the report's list). The webhook's cache keeps them by namespace instead.
pub fn in_namespace<'a, L>(namespace: &str, all: impl IntoIterator<Item = &'a L>) -> Vec<LimitRange>
where
    L: Borrow<LimitRange> + 'a,
{
    all.into_iter()
        .map(Borrow::borrow)
        .filter(|lr| lr.metadata.namespace.as_deref() == Some(namespace))
        .cloned()
        .collect()
}

/// The LimitRange items of the pod's namespace, by type.
pub(super) struct Ranges<'a> {
    /// Items of type `Container`.
    pub(super) container: Vec<&'a LimitRangeItem>,
    /// Items of type `Pod`.
    pub(super) pod: Vec<&'a LimitRangeItem>,
}

impl<'a> Ranges<'a> {
    /// The items of `limit_ranges`, by type.
    pub(super) fn of(limit_ranges: &'a [LimitRange]) -> Self {
        Ranges {
            container: items(limit_ranges, "Container").collect(),
            pod: items(limit_ranges, "Pod").collect(),
        }
    }
}

fn items<'a>(limit_ranges: &'a [LimitRange], kind: &'a str) -> impl Iterator<Item = &'a LimitRangeItem> + 'a {
    limit_ranges
        .iter()
        .filter_map(|lr| lr.spec.as_ref())
        .flat_map(|s| s.limits.iter())
        .filter(move |item| item.type_ == kind)
}

/// The tightest bound of `field` over the items (smallest max, largest min).
pub(super) fn bound(
    items: &[&LimitRangeItem],
    resource: ResourceName,
    field: fn(&LimitRangeItem) -> Option<&BTreeMap<String, Quantity>>,
    tightest: fn(u64, u64) -> u64,
) -> Option<u64> {
    items
        .iter()
        .filter_map(|i| field(i)?.get(resource.as_str()))
        .filter_map(|q| amount(resource, q))
        .reduce(tightest)
}

/// An item's `max`.
pub(super) fn lr_max(i: &LimitRangeItem) -> Option<&BTreeMap<String, Quantity>> {
    i.max.as_ref()
}
/// An item's `min`.
pub(super) fn lr_min(i: &LimitRangeItem) -> Option<&BTreeMap<String, Quantity>> {
    i.min.as_ref()
}
/// An item's `default`.
pub(super) fn lr_default(i: &LimitRangeItem) -> Option<&BTreeMap<String, Quantity>> {
    i.default.as_ref()
}
