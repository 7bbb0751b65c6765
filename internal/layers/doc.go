// Package layers holds only a test: that imports run one way through the
// tree (docs/design.md, "Package layers"). Foundations under internal/
// import nothing of the module above them; limits (the rule vocabulary)
// and policy (the policy language) depend on neither Redis nor asynq, even
// indirectly; gcra imports neither
// quotas nor taskrl; quotas not taskrl; no library package imports the binaries'
// code (cmd/...) or the examples'.
package layers
