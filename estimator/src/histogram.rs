//! Decaying exponential histograms, as the VPA recommender keeps them.
//!
//! Buckets grow geometrically: bucket 0 covers `[0, first)`, bucket `n ≥ 1` starts at
//! `first · (ratio^n − 1) / (ratio − 1)`, and the last bucket starts at or above `max`. With the
//! VPA defaults (ratio 1.05; CPU from 0.01 core to 1000 cores; memory from 1e7 B to 1e12 B) that
//! is 176 buckets each.
//!
//! A sample taken at time `t` weighs `weight · 2^((t − reference) / half_life)`: a sample one
//! half-life older than another weighs half as much. Only relative weights matter, so when the
//! exponent grows past [`MAX_DECAY_EXPONENT`] the reference time moves forward (to a whole
//! multiple of the half-life) and every stored weight is scaled down by the same power of two.
//!
//! Percentiles return the *upper* edge of the bucket where the cumulative weight reaches the
//! percentile (the last bucket, which has no upper edge, returns its start).

use serde::{Deserialize, Serialize};

/// Past `2^MAX_DECAY_EXPONENT` the reference time is moved forward.
pub const MAX_DECAY_EXPONENT: i64 = 100;

/// What was wrong with histogram options or a stored histogram.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HistogramError {
    /// The bucket layout is not usable (see [`HistogramOptions::exponential`]).
    #[error(
        "invalid histogram options (first bucket {first}, ratio {ratio}, max {max}, epsilon {epsilon}): \
         first bucket, max and epsilon must be > 0 and ratio > 1"
    )]
    InvalidOptions {
        /// Width of the first bucket.
        first: f64,
        /// Growth of each bucket over the one before.
        ratio: f64,
        /// Value at which the last bucket starts.
        max: f64,
        /// Weight below which a bucket counts as empty.
        epsilon: f64,
    },
    /// The half-life, in milliseconds, is below 1.
    #[error("half-life must be at least 1 ms, got {0} ms")]
    InvalidHalfLife(i64),
    #[error("stored histogram has bucket {bucket} but these options have {buckets} buckets")]
    /// A stored bucket index is past the last bucket.
    BucketOutOfRange {
        /// The stored index.
        bucket: usize,
        /// How many buckets the options have.
        buckets: usize,
    },
    #[error("stored histogram has weight {0}, weights must be finite and not negative")]
    /// A stored weight is negative or not finite.
    InvalidWeight(f64),
    #[error("stored histogram was made with other options ({stored}), these are {current}")]
    /// The stored layout differs from the current options.
    OptionsMismatch {
        /// The stored layout, described.
        stored: String,
        /// The current layout, described.
        current: String,
    },
    #[error(
        "stored history has {field} {ms} ms; times must be between 0 and {MAX_STORED_TIME_MS} ms \
         since the Unix epoch (the end of year 9999)"
    )]
    /// A stored time is outside `0..=MAX_STORED_TIME_MS`.
    InvalidTime {
        /// Which stored field.
        field: &'static str,
        /// Its value, in milliseconds since the Unix epoch.
        ms: i64,
    },
}

/// The latest time a checkpoint may hold, in milliseconds since the Unix epoch: the end of year
/// 9999. Any time in range keeps the estimator's arithmetic (differences, interval ends, decay
/// reference shifts) far from `i64` overflow; a checkpoint with a time outside it is not used.
pub const MAX_STORED_TIME_MS: i64 = 253_402_300_799_999;

/// `ms` when it is a time a checkpoint may hold (see [`MAX_STORED_TIME_MS`]).
pub fn stored_time(field: &'static str, ms: i64) -> Result<i64, HistogramError> {
    if (0..=MAX_STORED_TIME_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(HistogramError::InvalidTime { field, ms })
    }
}

/// Bucket layout of an exponential histogram.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HistogramOptions {
    /// Width of the first bucket.
    pub first_bucket: f64,
    /// Each bucket is this many times wider than the one before (> 1).
    pub ratio: f64,
    /// Values at or above the last bucket's start fall in the last bucket.
    pub max_value: f64,
    /// A bucket lighter than this counts as empty.
    pub epsilon: f64,
    num_buckets: usize,
}

/// The bucket layout as stored with a histogram, to check it still fits on load.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Layout {
    /// [`HistogramOptions::first_bucket`].
    pub first_bucket: f64,
    /// [`HistogramOptions::ratio`].
    pub ratio: f64,
    /// [`HistogramOptions::max_value`].
    pub max_value: f64,
}

impl HistogramOptions {
    /// Exponential buckets: the first `first_bucket` wide, each next one `ratio` times wider,
    /// until a bucket starts at or above `max_value`.
    pub fn exponential(
        max_value: f64,
        first_bucket: f64,
        ratio: f64,
        epsilon: f64,
    ) -> Result<Self, HistogramError> {
        let valid = max_value.is_finite()
            && first_bucket.is_finite()
            && ratio.is_finite()
            && epsilon.is_finite()
            && max_value > 0.0
            && first_bucket > 0.0
            && ratio > 1.0
            && epsilon > 0.0;
        if !valid {
            return Err(HistogramError::InvalidOptions {
                first: first_bucket,
                ratio,
                max: max_value,
                epsilon,
            });
        }
        let n = ((max_value * (ratio - 1.0) / first_bucket + 1.0).ln() / ratio.ln()).ceil();
        if !(1.0..=100_000.0).contains(&n) {
            return Err(HistogramError::InvalidOptions {
                first: first_bucket,
                ratio,
                max: max_value,
                epsilon,
            });
        }
        // n is a small positive whole number here
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let num_buckets = n as usize + 1;
        Ok(HistogramOptions {
            first_bucket,
            ratio,
            max_value,
            epsilon,
            num_buckets,
        })
    }

    /// How many buckets there are, the last one unbounded above.
    pub fn num_buckets(&self) -> usize {
        self.num_buckets
    }

    /// Index of the bucket holding `value`; values outside the range go to the first or last bucket.
    pub fn find_bucket(&self, value: f64) -> usize {
        if value.is_nan() || value < self.first_bucket {
            return 0;
        }
        let b = ((value * (self.ratio - 1.0) / self.first_bucket + 1.0).ln() / self.ratio.ln()).floor();
        if !b.is_finite() || b >= (self.num_buckets - 1) as f64 {
            return self.num_buckets - 1;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let b = b as usize;
        // Guard against rounding right at a bucket edge. VPA (histogram_options.go, FindBucket,
        // line 120) has no such guard; the two can only part for a value within a rounding
        // error of an edge (e.g. exactly 20500000 bytes).
        if b + 1 < self.num_buckets && value >= self.bucket_start(b + 1) {
            b + 1
        } else if b > 0 && value < self.bucket_start(b) {
            b - 1
        } else {
            b
        }
    }

    /// Where bucket `bucket` starts.
    pub fn bucket_start(&self, bucket: usize) -> f64 {
        if bucket == 0 {
            return 0.0;
        }
        // VPA: pkg/recommender/util/histogram_options.go, GetBucketStart (line 134). Go's
        // math.Pow takes a whole exponent by repeated squaring, as `powi` does, so the edges
        // come out the same to the last bit.
        let n = i32::try_from(bucket).unwrap_or(i32::MAX);
        self.first_bucket * (self.ratio.powi(n) - 1.0) / (self.ratio - 1.0)
    }

    /// The layout to store with a histogram.
    pub fn layout(&self) -> Layout {
        Layout {
            first_bucket: self.first_bucket,
            ratio: self.ratio,
            max_value: self.max_value,
        }
    }
}

impl Layout {
    fn describe(&self) -> String {
        format!(
            "first bucket {}, ratio {}, max {}",
            self.first_bucket, self.ratio, self.max_value
        )
    }
}

/// A histogram whose samples lose half their weight every `half_life_ms`.
#[derive(Clone, Debug, PartialEq)]
pub struct DecayingHistogram {
    options: HistogramOptions,
    half_life_ms: i64,
    /// Always a whole multiple of the half-life.
    reference_ms: i64,
    weights: Vec<f64>,
    total_weight: f64,
    /// First non-empty bucket, or the last bucket when empty.
    min_bucket: usize,
    /// Last non-empty bucket, or 0 when empty.
    max_bucket: usize,
}

/// A histogram as stored in the checkpoint: the non-zero buckets only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredHistogram {
    /// The bucket layout it was made with.
    pub layout: Layout,
    /// Half-life of the weights, in milliseconds.
    pub half_life_ms: i64,
    /// Decay reference time, in milliseconds since the Unix epoch.
    pub reference_ms: i64,
    /// Sum of the weights (relative to the reference time).
    pub total_weight: f64,
    /// `(bucket index, weight)`, ascending.
    pub buckets: Vec<(usize, f64)>,
}

impl DecayingHistogram {
    /// An empty histogram; fails when `half_life_ms` is below 1.
    pub fn new(options: HistogramOptions, half_life_ms: i64) -> Result<Self, HistogramError> {
        if half_life_ms < 1 {
            return Err(HistogramError::InvalidHalfLife(half_life_ms));
        }
        let n = options.num_buckets();
        Ok(DecayingHistogram {
            options,
            half_life_ms,
            reference_ms: 0,
            weights: vec![0.0; n],
            total_weight: 0.0,
            min_bucket: n - 1,
            max_bucket: 0,
        })
    }

    /// The bucket layout.
    pub fn options(&self) -> &HistogramOptions {
        &self.options
    }

    /// Whether no bucket weighs at least epsilon.
    pub fn is_empty(&self) -> bool {
        self.weights[self.min_bucket] < self.options.epsilon
    }

    /// Sum of the weights, relative to the reference time.
    pub fn total_weight(&self) -> f64 {
        self.total_weight
    }

    /// Decay reference time, in milliseconds since the Unix epoch (a multiple of the half-life).
    pub fn reference_ms(&self) -> i64 {
        self.reference_ms
    }

    /// Adds `value` with `weight` (before decay) as seen at `at_ms`. Negative or non-finite
    /// weights and non-finite values are ignored.
    pub fn add_sample(&mut self, value: f64, weight: f64, at_ms: i64) {
        if !(weight.is_finite() && weight >= 0.0 && value.is_finite()) {
            return;
        }
        let w = weight * self.decay_factor(at_ms);
        let bucket = self.options.find_bucket(value);
        self.weights[bucket] += w;
        self.total_weight += w;
        if self.weights[bucket] >= self.options.epsilon {
            self.min_bucket = self.min_bucket.min(bucket);
            self.max_bucket = self.max_bucket.max(bucket);
        }
    }

    /// Takes back a sample added earlier with the same value, weight and time. As VPA does
    /// (pkg/recommender/util/histogram.go, `SubtractSample` and `safeSubtract`, lines 122-141),
    /// a bucket or total left below epsilon becomes exactly 0, and the first/last non-empty
    /// buckets are found again. VPA uses it only for memory peaks: when an interval's peak
    /// grows, the old peak is taken out and the new one added.
    pub fn subtract_sample(&mut self, value: f64, weight: f64, at_ms: i64) {
        if !(weight.is_finite() && weight >= 0.0 && value.is_finite()) {
            return;
        }
        let w = weight * self.decay_factor(at_ms);
        let bucket = self.options.find_bucket(value);
        let eps = self.options.epsilon;
        let less = |v: f64| if v - w < eps { 0.0 } else { v - w };
        self.total_weight = less(self.total_weight);
        self.weights[bucket] = less(self.weights[bucket]);
        self.trim_min_max();
    }

    /// Moves the first/last non-empty bucket markers past buckets lighter than epsilon.
    fn trim_min_max(&mut self) {
        let last = self.options.num_buckets() - 1;
        while self.weights[self.min_bucket] < self.options.epsilon && self.min_bucket < last {
            self.min_bucket += 1;
        }
        while self.weights[self.max_bucket] < self.options.epsilon && self.max_bucket > 0 {
            self.max_bucket -= 1;
        }
    }

    /// The value below which `p` (0..=1) of the weight lies, as the upper edge of its bucket.
    /// 0 when empty.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        let threshold = p * self.total_weight;
        let mut sum = 0.0;
        let mut bucket = self.min_bucket;
        while bucket < self.max_bucket {
            sum += self.weights[bucket];
            if sum >= threshold {
                break;
            }
            bucket += 1;
        }
        if bucket + 1 < self.options.num_buckets() {
            self.options.bucket_start(bucket + 1)
        } else {
            self.options.bucket_start(bucket)
        }
    }

    fn decay_factor(&mut self, at_ms: i64) -> f64 {
        let limit = self
            .reference_ms
            .saturating_add(self.half_life_ms.saturating_mul(MAX_DECAY_EXPONENT));
        if at_ms > limit {
            self.shift_reference(at_ms);
        }
        let exp = (at_ms - self.reference_ms) as f64 / self.half_life_ms as f64;
        exp.exp2()
    }

    /// Moves the reference time to `to_ms` rounded to a multiple of the half-life and rescales
    /// the stored weights so that relative weights stay the same.
    fn shift_reference(&mut self, to_ms: i64) {
        let h = self.half_life_ms;
        let new_ref = (to_ms + h / 2).div_euclid(h) * h;
        let halvings = (new_ref - self.reference_ms) / h;
        let factor = (-(halvings as f64)).exp2();
        self.scale(factor);
        self.reference_ms = new_ref;
    }

    fn scale(&mut self, factor: f64) {
        if self.is_empty() {
            self.total_weight *= factor;
            return;
        }
        for w in &mut self.weights[self.min_bucket..=self.max_bucket] {
            *w *= factor;
        }
        self.total_weight *= factor;
        self.trim_min_max();
    }

    /// The non-empty buckets, for the checkpoint.
    pub fn to_stored(&self) -> StoredHistogram {
        let buckets = if self.is_empty() {
            Vec::new()
        } else {
            (self.min_bucket..=self.max_bucket)
                .filter(|&b| self.weights[b] > 0.0)
                .map(|b| (b, self.weights[b]))
                .collect()
        };
        StoredHistogram {
            layout: self.options.layout(),
            half_life_ms: self.half_life_ms,
            reference_ms: self.reference_ms,
            total_weight: self.total_weight,
            buckets,
        }
    }

    /// Rebuilds a histogram from its stored form, checking that it was made with `options`.
    pub fn from_stored(
        stored: &StoredHistogram,
        options: HistogramOptions,
        half_life_ms: i64,
    ) -> Result<Self, HistogramError> {
        // layouts round-trip through JSON exactly, so equality is the right test
        if stored.layout != options.layout() {
            return Err(HistogramError::OptionsMismatch {
                stored: stored.layout.describe(),
                current: options.layout().describe(),
            });
        }
        let mut h = DecayingHistogram::new(options, half_life_ms)?;
        if !(stored.total_weight.is_finite() && stored.total_weight >= 0.0) {
            return Err(HistogramError::InvalidWeight(stored.total_weight));
        }
        for &(bucket, weight) in &stored.buckets {
            if bucket >= options.num_buckets() {
                return Err(HistogramError::BucketOutOfRange {
                    bucket,
                    buckets: options.num_buckets(),
                });
            }
            if !(weight.is_finite() && weight >= 0.0) {
                return Err(HistogramError::InvalidWeight(weight));
            }
            h.weights[bucket] += weight;
            if h.weights[bucket] >= options.epsilon {
                h.min_bucket = h.min_bucket.min(bucket);
                h.max_bucket = h.max_bucket.max(bucket);
            }
        }
        h.total_weight = stored.total_weight;
        h.reference_ms = stored_time("referenceMs", stored.reference_ms)?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: i64 = 24 * 3600 * 1000;

    fn cpu() -> HistogramOptions {
        HistogramOptions::exponential(1000.0, 0.01, 1.05, 0.0001).unwrap()
    }

    fn mem() -> HistogramOptions {
        HistogramOptions::exponential(1e12, 1e7, 1.05, 0.0001).unwrap()
    }

    #[test]
    fn vpa_default_layouts_have_176_buckets() {
        assert_eq!(cpu().num_buckets(), 176);
        assert_eq!(mem().num_buckets(), 176);
        // last bucket starts at or above the max, the one before below it
        let o = cpu();
        assert!(o.bucket_start(175) >= 1000.0);
        assert!(o.bucket_start(174) < 1000.0);
    }

    #[test]
    fn bucket_edges_grow_by_five_percent() {
        let o = cpu();
        // by hand: start(n) = 0.01 · (1.05^n − 1) / 0.05
        assert_eq!(o.bucket_start(0), 0.0);
        assert!((o.bucket_start(1) - 0.01).abs() < 1e-12);
        assert!((o.bucket_start(2) - 0.0205).abs() < 1e-12);
        assert!((o.bucket_start(3) - 0.031525).abs() < 1e-12);
        assert_eq!(o.find_bucket(0.0), 0);
        assert_eq!(o.find_bucket(0.009), 0);
        assert_eq!(o.find_bucket(0.01), 1);
        assert_eq!(o.find_bucket(0.015), 1);
        assert_eq!(o.find_bucket(0.0205), 2);
        assert_eq!(o.find_bucket(0.03), 2);
        assert_eq!(o.find_bucket(1e9), 175);
        assert_eq!(o.find_bucket(f64::NAN), 0);
    }

    #[test]
    fn bad_options_are_rejected() {
        assert!(HistogramOptions::exponential(1000.0, 0.01, 1.0, 0.0001).is_err());
        assert!(HistogramOptions::exponential(1000.0, 0.0, 1.05, 0.0001).is_err());
        assert!(HistogramOptions::exponential(-1.0, 0.01, 1.05, 0.0001).is_err());
        assert!(DecayingHistogram::new(cpu(), 0).is_err());
    }

    #[test]
    fn percentile_is_the_upper_edge_of_the_bucket() {
        let mut h = DecayingHistogram::new(cpu(), DAY_MS).unwrap();
        assert_eq!(h.percentile(0.9), 0.0, "empty histogram");
        let t = 1_700_000_000_000;
        h.add_sample(0.015, 1.0, t); // bucket 1: [0.01, 0.0205)
        h.add_sample(0.025, 1.0, t); // bucket 2: [0.0205, 0.031525)
        assert!((h.percentile(0.5) - 0.0205).abs() < 1e-12);
        assert!((h.percentile(0.9) - 0.031525).abs() < 1e-12);
        assert!((h.percentile(0.0) - 0.0205).abs() < 1e-12);
    }

    #[test]
    fn a_sample_one_half_life_older_weighs_half() {
        let mut h = DecayingHistogram::new(cpu(), DAY_MS).unwrap();
        let t = 1_700_000_000_000;
        h.add_sample(0.015, 1.0, t); // weight 1
        h.add_sample(0.025, 1.0, t + DAY_MS); // weight 2 relative to the first
        // weights 1 : 2 → the first bucket holds exactly one third of the weight
        assert!((h.percentile(0.33) - 0.0205).abs() < 1e-12);
        assert!((h.percentile(0.34) - 0.031525).abs() < 1e-12);
        // same samples at the same time: the first holds half
        let mut flat = DecayingHistogram::new(cpu(), DAY_MS).unwrap();
        flat.add_sample(0.015, 1.0, t);
        flat.add_sample(0.025, 1.0, t);
        assert!((flat.percentile(0.34) - 0.0205).abs() < 1e-12);
    }

    #[test]
    fn reference_time_moves_forward_without_changing_relative_weights() {
        let mut early = DecayingHistogram::new(cpu(), 1000).unwrap();
        early.add_sample(0.015, 1.0, 0);
        early.add_sample(0.025, 1.0, 1000);
        // 200 half-lives later: past the renormalisation limit, the reference moves
        let mut late = DecayingHistogram::new(cpu(), 1000).unwrap();
        late.add_sample(0.015, 1.0, 200_000);
        late.add_sample(0.025, 1.0, 201_000);
        assert_eq!(late.reference_ms(), 200_000);
        assert_eq!(late.percentile(0.34), early.percentile(0.34));
        assert_eq!(late.percentile(0.33), early.percentile(0.33));
        // samples 150 half-lives old vanish below epsilon rather than overflow the new ones
        early.add_sample(0.5, 1.0, 150_000);
        assert!(early.total_weight().is_finite());
        assert!((early.percentile(0.01) - cpu().bucket_start(cpu().find_bucket(0.5) + 1)).abs() < 1e-12);
    }

    #[test]
    fn weights_stay_finite_over_years_of_samples() {
        let mut h = DecayingHistogram::new(cpu(), DAY_MS).unwrap();
        let start = 1_700_000_000_000;
        for i in 0..(3 * 365) {
            h.add_sample(0.5, 1.0, start + i * DAY_MS);
        }
        assert!(h.total_weight().is_finite());
        assert!(h.total_weight() > 0.0);
        let edge = h.percentile(0.9);
        assert!(edge > 0.5 && edge < 0.5 * 1.06, "{edge}");
    }

    #[test]
    fn subtracting_a_sample_takes_it_back() {
        let mut h = DecayingHistogram::new(mem(), DAY_MS).unwrap();
        let t = 1_700_000_000_000;
        h.add_sample(3e8, 1.0, t);
        h.add_sample(5e8, 1.0, t + DAY_MS);
        h.subtract_sample(5e8, 1.0, t + DAY_MS);
        // only the first sample is left: every percentile is its bucket
        let one = mem().bucket_start(mem().find_bucket(3e8) + 1);
        assert!((h.percentile(0.99) - one).abs() < 1e-3);
        h.subtract_sample(3e8, 1.0, t);
        assert!(h.is_empty());
        assert_eq!(h.total_weight(), 0.0);
        assert_eq!(h.percentile(0.5), 0.0);
    }

    #[test]
    fn stored_form_round_trips() {
        let mut h = DecayingHistogram::new(mem(), DAY_MS).unwrap();
        h.add_sample(3e8, 1.0, 1_700_000_000_000);
        h.add_sample(5e8, 2.0, 1_700_000_100_000);
        let stored = h.to_stored();
        let json = serde_json::to_string(&stored).unwrap();
        let back: StoredHistogram = serde_json::from_str(&json).unwrap();
        let g = DecayingHistogram::from_stored(&back, mem(), DAY_MS).unwrap();
        assert_eq!(g, h);
    }

    #[test]
    fn stored_form_with_other_options_or_bad_buckets_is_refused() {
        let mut h = DecayingHistogram::new(mem(), DAY_MS).unwrap();
        h.add_sample(3e8, 1.0, 1_700_000_000_000);
        let mut stored = h.to_stored();
        let other = HistogramOptions::exponential(1e12, 1e7, 1.10, 0.0001).unwrap();
        assert!(matches!(
            DecayingHistogram::from_stored(&stored, other, DAY_MS),
            Err(HistogramError::OptionsMismatch { .. })
        ));
        stored.buckets.push((500, 1.0));
        assert!(matches!(
            DecayingHistogram::from_stored(&stored, mem(), DAY_MS),
            Err(HistogramError::BucketOutOfRange { bucket: 500, .. })
        ));
        stored.buckets.pop();
        stored.buckets.push((3, -1.0));
        assert!(matches!(
            DecayingHistogram::from_stored(&stored, mem(), DAY_MS),
            Err(HistogramError::InvalidWeight(_))
        ));
    }

    /// Found by the checkpoint fuzz target: a stored reference time of i64::MIN made the next
    /// sample's decay shift overflow (a panic with overflow checks, garbage weights without).
    #[test]
    fn stored_form_with_a_time_out_of_range_is_refused() {
        let mut h = DecayingHistogram::new(mem(), DAY_MS).unwrap();
        h.add_sample(3e8, 1.0, 1_700_000_000_000);
        let mut stored = h.to_stored();
        for bad in [i64::MIN, -1, MAX_STORED_TIME_MS + 1, i64::MAX] {
            stored.reference_ms = bad;
            let err = DecayingHistogram::from_stored(&stored, mem(), DAY_MS).unwrap_err();
            assert!(matches!(err, HistogramError::InvalidTime { field: "referenceMs", ms } if ms == bad));
            assert!(err.to_string().contains("between 0 and"), "{err}");
        }
        // the last time in range still takes samples now and then
        stored.reference_ms = MAX_STORED_TIME_MS;
        let mut g = DecayingHistogram::from_stored(&stored, mem(), DAY_MS).unwrap();
        g.add_sample(3e8, 1.0, 1_800_000_000_000);
        assert!(g.total_weight().is_finite() && g.percentile(0.5) > 0.0);
    }
}
