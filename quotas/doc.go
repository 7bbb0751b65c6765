// Package quotas will evaluate sets of rules — GCRA, fixed, calendar and
// sliding windows, and concurrency leases — atomically in one Redis round
// trip. It is being built (see the project's issues); nothing is exported yet.
package quotas
