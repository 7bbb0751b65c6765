package quotas

import (
	"slices"

	"github.com/taskrl/taskrl/internal/batch"
)

// joinRequests is the batch.Join of the set script: the number of requests,
// then each request's arguments (a job's Args are a call of its own: its
// number of requests, then their arguments); a request whose rules'
// parameters (Args[specAt:End]) are those of the request before sends 0
// for them, and the script reuses what it read of them.
func joinRequests(cmd []any, jobs []*batch.Job) []any {
	n := 0
	for _, j := range jobs {
		n += max(j.Requests, 1)
	}
	cmd = append(cmd, n)
	var prev []any
	for _, j := range jobs {
		if j.Requests > 1 {
			// Several requests (ReserveAndAllow's): sent whole, and the
			// next job's rules after them.
			cmd = append(cmd, j.Args[1:]...)
			prev = nil
			continue
		}
		spec := j.Args[specAt:j.End]
		if slices.Equal(spec, prev) {
			cmd = append(cmd, j.Args[1:specAt]...)
			cmd = append(cmd, 0)
			cmd = append(cmd, j.Args[j.End:]...)
		} else {
			cmd = append(cmd, j.Args[1:]...)
		}
		prev = spec
	}
	return cmd
}
