// Package taskrl will hold the asynq integration: policies, the worker
// middleware that holds or reschedules throttled tasks, and policy-file
// loading. It is being built (see the project's issues); nothing is exported
// yet.
package taskrl
