// Command recommend replays usage traces through the VPA recommender's own model and
// estimators (the version pinned in ../../go.mod) and prints its recommendations, for
// nodewarden's differential test (agent/tests/vpa_differential.rs).
//
// Input (stdin): {"traces": [{"name", "containers", "events": [{"t", "kind", "milli", "bytes"}]}]}
// where t is Unix milliseconds and kind is "cpu" (milli = usage in millicores), "memory"
// (bytes = working set) or "oom" (bytes = the container's memory request). Events are fed
// in the order given, so out-of-order samples reach the model as they would from a feeder.
//
// Output (stdout): {"results": [{"name", "target", "lowerBound", "upperBound", ...}]} with
// CPU in millicores and memory in bytes, exactly as VPA's model holds them (ResourceAmount),
// before any rendering into quantities.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/logic"
	"k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/model"
)

type event struct {
	T     int64  `json:"t"`
	Kind  string `json:"kind"`
	Milli int64  `json:"milli"`
	Bytes int64  `json:"bytes"`
}

type trace struct {
	Name       string  `json:"name"`
	Containers int     `json:"containers"`
	Events     []event `json:"events"`
}

type input struct {
	Traces []trace `json:"traces"`
}

type amounts struct {
	CPUMilli    int64 `json:"cpuMilli"`
	MemoryBytes int64 `json:"memoryBytes"`
}

type result struct {
	Name         string  `json:"name"`
	Target       amounts `json:"target"`
	LowerBound   amounts `json:"lowerBound"`
	UpperBound   amounts `json:"upperBound"`
	SampleCount  int     `json:"sampleCount"`
	OOMsAccepted int     `json:"oomsAccepted"`
	OOMsDropped  int     `json:"oomsDropped"`
}

type output struct {
	Results []result `json:"results"`
}

func amountsOf(r model.Resources) amounts {
	return amounts{CPUMilli: int64(r[model.ResourceCPU]), MemoryBytes: int64(r[model.ResourceMemory])}
}

func replay(rec logic.PodResourceRecommender, tr trace) (result, error) {
	agg := model.NewAggregateContainerState()
	container := model.NewContainerState(model.Resources{}, agg)
	res := result{Name: tr.Name}
	for i, ev := range tr.Events {
		at := time.UnixMilli(ev.T).UTC()
		switch ev.Kind {
		case "cpu":
			container.AddSample(&model.ContainerUsageSample{
				MeasureStart: at,
				Usage:        model.ResourceAmount(ev.Milli),
				Resource:     model.ResourceCPU,
			})
		case "memory":
			container.AddSample(&model.ContainerUsageSample{
				MeasureStart: at,
				Usage:        model.ResourceAmount(ev.Bytes),
				Resource:     model.ResourceMemory,
			})
		case "oom":
			if err := container.RecordOOM(at, model.ResourceAmount(ev.Bytes)); err != nil {
				res.OOMsDropped++
			} else {
				res.OOMsAccepted++
			}
		default:
			return res, fmt.Errorf("trace %s, event %d: unknown kind %q", tr.Name, i, ev.Kind)
		}
	}
	// The per-pod floors are divided among the containers of the map the recommender gets,
	// so the other containers of the pod are present, with no samples.
	states := model.ContainerNameToAggregateStateMap{"c": agg}
	for i := 1; i < tr.Containers; i++ {
		states[fmt.Sprintf("other-%d", i)] = model.NewAggregateContainerState()
	}
	r := rec.GetRecommendedPodResources(states)["c"]
	res.Target = amountsOf(r.Target)
	res.LowerBound = amountsOf(r.LowerBound)
	res.UpperBound = amountsOf(r.UpperBound)
	res.SampleCount = agg.TotalSamplesCount
	return res, nil
}

func main() {
	var in input
	dec := json.NewDecoder(os.Stdin)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "recommend: reading traces from stdin: %v\n", err)
		os.Exit(2)
	}
	// The recommender's flag defaults (pkg/recommender/config/config.go,
	// DefaultRecommenderConfig). That package is not imported: it pulls in the metrics
	// clients, which this module does not otherwise need.
	rec := logic.CreatePodResourceRecommender(logic.RecommendationConfig{
		SafetyMarginFraction:       0.15,
		PodMinCPUMillicores:        25,
		PodMinMemoryMb:             250,
		TargetCPUPercentile:        0.9,
		LowerBoundCPUPercentile:    0.5,
		UpperBoundCPUPercentile:    0.95,
		ConfidenceIntervalCPU:      24 * time.Hour,
		TargetMemoryPercentile:     0.9,
		LowerBoundMemoryPercentile: 0.5,
		UpperBoundMemoryPercentile: 0.95,
		ConfidenceIntervalMemory:   24 * time.Hour,
	})
	var out output
	for _, tr := range in.Traces {
		r, err := replay(rec, tr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "recommend: %v\n", err)
			os.Exit(2)
		}
		out.Results = append(out.Results, r)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "recommend: writing results: %v\n", err)
		os.Exit(1)
	}
}
