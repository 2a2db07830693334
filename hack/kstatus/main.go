// Command kstatus prints what sigs.k8s.io/cli-utils/pkg/kstatus (the library Flux and kpt use to
// decide health) computes for each object it reads: the health table test
// (tests/unit/test_health_table.py) runs it over AgentRuns and AgentPolicies.
//
// Input on stdin: one JSON array of objects. Output on stdout: one JSON array, in the same order,
// of {"status": "Current|InProgress|Failed|...", "message": "...", "reason": "..."}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"` // the reason of the condition it decided by, if any
	Error   string `json:"error,omitempty"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var raws []json.RawMessage
	if err := json.NewDecoder(in).Decode(&raws); err != nil {
		return fmt.Errorf("stdin is not a JSON array of objects: %w", err)
	}
	results := make([]result, 0, len(raws))
	for i, raw := range raws {
		// Unstructured's own decoder keeps integers int64 (metadata.generation), as a client's would.
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(raw); err != nil {
			return fmt.Errorf("object %d: %w", i, err)
		}
		res, err := status.Compute(obj)
		if err != nil {
			results = append(results, result{Error: err.Error()})
			continue
		}
		out := result{Status: string(res.Status), Message: res.Message}
		if len(res.Conditions) > 0 {
			out.Reason = res.Conditions[0].Reason
		}
		results = append(results, out)
	}
	return json.NewEncoder(out).Encode(results)
}
