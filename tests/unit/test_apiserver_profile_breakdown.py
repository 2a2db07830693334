"""`make profile`'s breakdown of kube-apiserver's CPU (bench/peers/apiserver_pprof.py): the text of
``go tool pprof -traces`` parsed into samples, each charged to one request kind and one kind of
work by the first label (in the tables' order) a frame of its stack matches."""

from __future__ import annotations

from bench.peers.apiserver_pprof import breakdown, parse_traces

TRACES = """File: kube-apiserver
Type: cpu
Duration: 10.06s, Total samples = 0.06s (0.60%)
-----------+-------------------------------------------------------
      20ms   encoding/json.(*decodeState).object
             k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning.prune
             k8s.io/apiextensions-apiserver/pkg/apiserver.(*crdHandler).serveStatus.UpdateResource.func2.4
             k8s.io/apiserver/pkg/endpoints/handlers/finisher.finishRequest.func1
-----------+-------------------------------------------------------
      10ms   encoding/json.Unmarshal
             k8s.io/apiserver/pkg/storage/etcd3.decodeObj
             k8s.io/apiserver/pkg/storage/etcd3.(*watchChan).serialProcessEvents
-----------+-------------------------------------------------------
   1.50ms   runtime.scanObject
             runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
      20ms   encoding/json.Marshal
             k8s.io/apiserver/pkg/endpoints/handlers.(*patcher).patchResource.func2
-----------+-------------------------------------------------------
"""


def test_samples_are_parsed_with_their_cpu_and_frames_leaf_first() -> None:
    samples = parse_traces(TRACES)
    assert [round(seconds, 4) for seconds, _ in samples] == [0.02, 0.01, 0.0015, 0.02]
    assert samples[1][1] == [
        "encoding/json.Unmarshal",
        "k8s.io/apiserver/pkg/storage/etcd3.decodeObj",
        "k8s.io/apiserver/pkg/storage/etcd3.(*watchChan).serialProcessEvents",
    ]


def test_each_sample_is_charged_once_by_request_and_by_work() -> None:
    out = breakdown(parse_traces(TRACES))
    assert out["cpu_seconds"] == 0.052
    assert out["by_request_kind"] == {
        "status update (PUT .../status)": 0.02,
        "patch": 0.02,
        "watch cache: decode etcd's events": 0.01,
        "garbage collector": 0.002,
    }
    # The status update's JSON is pruning's (structural schema ranks before JSON); the rest is JSON.
    assert out["by_kind_of_work"] == {
        "JSON encode/decode": 0.03,
        "structural schema (prune, default)": 0.02,
        "garbage collector": 0.002,
    }
