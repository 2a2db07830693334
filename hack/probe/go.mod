// The node test bed's probe: a static binary that is also the whole of its test images
// (testkit/durable_agents_testkit/localcluster/node.py). Standard library only.
module github.com/durable-agents/durable-agents/hack/probe

go 1.24
