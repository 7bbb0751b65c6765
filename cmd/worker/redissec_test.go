package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// aclDir holds the ACL files docs/operations.md documents: one user line each.
const aclDir = "../../examples/redis-acl"

// securityPolicy has a GCRA rule and a concurrency rule, so that both
// taskrl's rule-set program and its concurrency leases run.
const securityPolicy = `rules:
  - name: sec-rate
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 50, per: 1s, burst: 5}
  - name: sec-concurrency
    match: {type: "http:call"}
    key: "{{.business_id}}"
    concurrency: {max: 2, lease: 30s}
`

// TestACLDocumented: docs/operations.md (Security) shows the shipped ACL
// files' lines as they are.
func TestACLDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"worker.acl", "enqueue.acl"} {
		b, err := os.ReadFile(filepath.Join(aclDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if line := strings.TrimSpace(string(b)); !strings.Contains(string(readme), "\n"+line+"\n") {
			t.Errorf("docs/operations.md does not show %s as it is:\n%s", name, line)
		}
	}
}

// aclUser is a user of a shipped ACL file, with a password of this test's.
type aclUser struct {
	name, password string
	rules          []string // the file's rules, password filled in
}

// url returns the redis:// URL that logs in as u at addr.
func (u aclUser) url(addr string) string {
	return "redis://" + u.name + ":" + u.password + "@" + addr
}

// readACL reads the one user line of the shipped ACL file name and fills
// in a random password for its placeholder, #PLACEHOLDER, which must be
// there: a file that ships a password of its own fails the test.
func readACL(t *testing.T, name, placeholder string) aclUser {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(aclDir, name))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 1 || strings.Count(lines[0], "#"+placeholder) != 1 || strings.ContainsAny(lines[0], "<>") {
		t.Fatalf("%s: want one user line with the password placeholder #%s and no other password, got:\n%s", name, placeholder, b)
	}
	var rnd [16]byte
	rand.Read(rnd[:])
	pw := hex.EncodeToString(rnd[:])
	sum := sha256.Sum256([]byte(pw))
	f := strings.Fields(strings.Replace(lines[0], "#"+placeholder, "#"+hex.EncodeToString(sum[:]), 1))
	if f[0] != "user" {
		t.Fatalf("%s: the line does not start with user NAME", name)
	}
	return aclUser{name: f[1], password: pw, rules: f[2:]}
}

// aclLog returns the entries of the server's ACL LOG, one line each.
func aclLog(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	entries, err := admin.ACLLog(context.Background(), 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("user %s: %s %s (context %s, %d times)", e.Username, e.Reason, e.Object, e.Context, e.Count))
	}
	return out
}

// runBinary runs bin with args to its end and returns its exit status and
// output.
func runBinary(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	p := startWorker(t, bin, args...)
	return p.wait(t), p.logs.String()
}

// servedOnce waits until the API has answered want calls and the queue is
// empty, then checks that every call had its own Idempotency-Key (each
// task ran once) and that nothing was retried or archived.
func servedOnce(t *testing.T, a *api, in *asynq.Inspector, queue string, want int, w *workerProc) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		qi, err := in.GetQueueInfo(queue)
		if err == nil && len(a.byPath("/ok")) >= want && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls within 20s (queue %+v, %v); worker log:\n%s", len(a.byPath("/ok")), want, qi, err, w.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	seen := map[string]bool{}
	for _, c := range a.byPath("/ok") {
		if seen[c.Key] {
			t.Errorf("task %s called twice", c.Key)
		}
		seen[c.Key] = true
	}
	if len(seen) != want {
		t.Errorf("%d tasks called, want %d", len(seen), want)
	}
	if qi := queueInfo(t, in, queue); qi.Archived+qi.Retry != 0 {
		t.Errorf("queue %s: %d archived, %d to retry; want none; worker log:\n%s", queue, qi.Archived, qi.Retry, w.logs)
	}
}

// TestRedisACL runs both binaries as the users of the shipped ACL files
// (examples/redis-acl) on a redis-server that has exactly those users:
// enqueue (at once and with --cron) as taskrl-enqueue, the worker, worker
// status and worker limits as taskrl-worker, with every task served once,
// and the server's ACL LOG empty afterwards: the binaries never ask for a
// command, key or channel the ACL does not grant. Then it checks that the
// ACL is tight: what each user must not do is refused, and logged.
func TestRedisACL(t *testing.T) {
	worker, enqueue := workerAndEnqueue(t)
	wu, eu := readACL(t, "worker.acl", "WORKER_PASSWORD_SHA256"), readACL(t, "enqueue.acl", "ENQUEUE_PASSWORD_SHA256")
	aclFile := filepath.Join(t.TempDir(), "users.acl")
	var lines string
	for _, u := range []aclUser{wu, eu} {
		lines += "user " + u.name + " " + strings.Join(u.rules, " ") + "\n"
	}
	if err := os.WriteFile(aclFile, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartServer(t, "--aclfile", aclFile)
	admin := srv.Client(t) // the default user, for checks and the harness
	ctx := context.Background()
	if users, err := admin.ACLUsers(ctx).Result(); err != nil || strings.Join(users, " ") != "default taskrl-enqueue taskrl-worker" {
		t.Fatalf("users %q, %v", users, err)
	}
	in := asynq.NewInspectorFromRedisClient(admin)
	a := newAPI(t)
	policy := writePolicy(t, securityPolicy)
	const queue, n = "acl", 12

	// enqueue as taskrl-enqueue: at once, then one tick of a campaign.
	if code, out := runBinary(t, enqueue, "--redis", eu.url(srv.Addr()), "--url", a.URL+"/ok", "--count", fmt.Sprint(n), "--businesses", "3", "--queue", queue); code != 0 || !strings.Contains(out, fmt.Sprintf("enqueued %d tasks", n)) {
		t.Fatalf("enqueue: exit %d\n%s", code, out)
	}
	cron := startWorker(t, enqueue, "--redis", eu.url(srv.Addr()), "--url", a.URL+"/ok", "--count", "2", "--queue", queue, "--cron", "@every 1s", "--campaign", "acl")
	// The first tick, recorded or not (the ACL LOG below tells why not).
	cron.logs.waitFor(t, regexp.MustCompile(`msg="(fan-out enqueued|could not record the fan-out's tick|could not enqueue the campaign's fan-out task)"`), cron.done)
	if code := cron.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("enqueue --cron: exit %d\n%s", code, cron.logs)
	}
	ticks := strings.Count(cron.logs.String(), "fanout_task=") // each fan-out enqueued, its tick recorded or not

	// The worker as taskrl-worker, with its metrics server (/limits reads
	// the limits as worker status does).
	w := startWorker(t, worker, "--redis", wu.url(srv.Addr()), "--policy", policy, "--concurrency", "4", "--queues", queue+"=1", "--metrics-addr", "127.0.0.1:0")
	metrics := w.logs.waitFor(t, regexp.MustCompile(`msg="metrics listening" addr=(\S+)`), w.done)[1]
	servedOnce(t, a, in, queue, n+2*ticks, w)
	if code, body := get(t, "http://"+metrics+"/limits"); code != 200 || !strings.Contains(body, `"sec-rate"`) {
		t.Errorf("/limits: %d %s", code, body)
	}
	if code, body := get(t, "http://"+metrics+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	for _, args := range [][]string{
		{"status", "--policy", policy, "--key", "b1"},
		{"limits", "set", "sec-rate", "b1", "gcra: {rate: 5, per: 1s}"},
		{"limits", "list"},
		{"limits", "rm", "sec-rate", "b1"},
	} {
		code, out := runBinary(t, worker, append(args, "--redis", wu.url(srv.Addr()))...)
		if code != exitOK || !strings.Contains(out, "sec-rate") {
			t.Errorf("worker %s: exit %d\n%s", strings.Join(args[:2], " "), code, out)
		}
	}
	if code := w.stop(t, syscall.SIGTERM); code != exitOK {
		t.Errorf("worker: exit %d after SIGTERM; log:\n%s", code, w.logs)
	}
	if strings.Contains(w.logs.String()+cron.logs.String(), wu.password) || strings.Contains(cron.logs.String(), eu.password) {
		t.Error("a log shows a password")
	}
	if log := aclLog(t, admin); len(log) > 0 {
		t.Errorf("the ACL refused the binaries %d times:\n%s", len(log), strings.Join(log, "\n"))
	}

	// Without +fcall +function|load (docs/operations.md's choice for a Redis shared
	// with other applications) the worker runs the same code as scripts:
	// every task is served, and the only refusals are its first FCALLs (a
	// few, when they run at once).
	if err := admin.ACLSetUser(ctx, wu.name, "-fcall", "-function|load").Err(); err != nil {
		t.Fatal(err)
	}
	served := len(a.byPath("/ok"))
	if code, out := runBinary(t, enqueue, "--redis", eu.url(srv.Addr()), "--url", a.URL+"/ok", "--count", fmt.Sprint(n), "--businesses", "3", "--queue", queue); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s", code, out)
	}
	w = startWorker(t, worker, "--redis", wu.url(srv.Addr()), "--policy", policy, "--concurrency", "4", "--queues", queue+"=1")
	servedOnce(t, a, in, queue, served+n, w)
	if code := w.stop(t, syscall.SIGTERM); code != exitOK {
		t.Errorf("worker without functions: exit %d after SIGTERM; log:\n%s", code, w.logs)
	}
	if log := aclLog(t, admin); len(log) != 1 || !strings.HasPrefix(log[0], "user taskrl-worker: command fcall (context toplevel, ") {
		t.Errorf("without functions, the ACL LOG has %q; want the worker's first FCALLs only", log)
	}

	// Tight: each user is refused what it must not do, and the refusals are
	// logged (so the empty log above says something).
	if err := admin.ACLLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []struct {
		user    aclUser
		refused [][]any
	}{
		{wu, [][]any{
			{"flushall"}, {"config", "get", "requirepass"}, {"function", "flush"}, {"function", "delete", "x"}, {"script", "flush"},
			{"keys", "*"}, {"select", "1"}, {"set", "other:key", "v"}, {"get", "other:key"}, {"publish", "asynq:cancel", "x"},
			{"acl", "list"}, {"client", "list"}, {"config", "set", "maxmemory-policy", "noeviction"}, {"shutdown"}, {"migrate", "h", "1", "asynq:x", "0", "1"},
		}},
		{eu, [][]any{
			{"flushall"}, {"set", "other:key", "v"}, {"get", "taskrl:rules:x"}, {"set", "taskrl:overrides:{o}", "v"},
			{"rpoplpush", "asynq:{acl}:pending", "asynq:{acl}:active"}, {"lrem", "asynq:{acl}:pending", "0", "x"}, {"hgetall", "taskrl:x"},
			{"fcall", "f", "0"}, {"function", "load", "#!lua name=x\nredis.register_function('x', function() return 1 end)"}, {"scan", "0"},
		}},
	} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: u.user.name, Password: u.user.password})
		t.Cleanup(func() { c.Close() })
		for _, cmd := range u.refused {
			if err := c.Do(ctx, cmd...).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
				t.Errorf("%s: %v: %v, want NOPERM", u.user.name, cmd, err)
			}
		}
		// Subscribing to another channel than asynq's is refused too.
		ps := c.Subscribe(ctx, "other")
		if _, err := ps.Receive(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%s: SUBSCRIBE other: %v, want NOPERM", u.user.name, err)
		}
		ps.Close()
	}
	if log := aclLog(t, admin); len(log) < 2 {
		t.Errorf("refusals not logged: %q", log)
	}
}

// TestRedisTLS runs both binaries against a redis-server over TLS whose
// certificate a private CA signed: with --redis-tls-ca they enqueue and
// serve every task once; without it they refuse the certificate (exit 1),
// as certificates are verified by default.
func TestRedisTLS(t *testing.T) {
	worker, enqueue := workerAndEnqueue(t)
	srv := redistest.StartTLSServer(t)
	in := asynq.NewInspectorFromRedisClient(srv.Client(t))
	a := newAPI(t)
	policy := writePolicy(t, securityPolicy)
	url, ca := "rediss://"+srv.TLSAddr, srv.PKI.CAFile
	const queue, n = "tls", 8

	// Verification is on by default: the system's roots do not know the CA.
	code, out := runBinary(t, worker, "--redis", url, "--policy", policy, "--queues", queue+"=1")
	if code != exitRuntime || !strings.Contains(out, "certificate signed by unknown authority") || strings.Contains(out, "worker started") {
		t.Errorf("worker without --redis-tls-ca: exit %d, want %d and a certificate error:\n%s", code, exitRuntime, out)
	}
	code, out = runBinary(t, enqueue, "--redis", url, "--url", a.URL+"/ok", "--count", "1", "--queue", queue)
	if code != 1 || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("enqueue without --redis-tls-ca: exit %d, want 1 and a certificate error:\n%s", code, out)
	}

	// With the CA: rediss://, and host:port with --redis-tls by the name
	// localhost.
	if code, out := runBinary(t, enqueue, "--redis", url, "--redis-tls-ca", ca, "--url", a.URL+"/ok", "--count", fmt.Sprint(n), "--businesses", "2", "--queue", queue); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s", code, out)
	}
	w := startWorker(t, worker, "--redis", url, "--redis-tls-ca", ca, "--policy", policy, "--concurrency", "4", "--queues", queue+"=1")
	w.logs.waitFor(t, regexp.MustCompile(`msg="worker started".* tls=true`), w.done)
	servedOnce(t, a, in, queue, n, w)
	local := strings.Replace(srv.TLSAddr, "127.0.0.1", "localhost", 1)
	if code, out := runBinary(t, worker, "status", "--policy", policy, "--key", "b1", "--redis", local, "--redis-tls", "--redis-tls-ca", ca); code != exitOK || !strings.Contains(out, "sec-rate") {
		t.Errorf("worker status: exit %d\n%s", code, out)
	}
	if code := w.stop(t, syscall.SIGTERM); code != exitOK {
		t.Errorf("worker: exit %d after SIGTERM; log:\n%s", code, w.logs)
	}
}

// TestRedisACLCluster runs both binaries on the 3-master Redis Cluster as
// the shipped ACL users with what docs/operations.md adds for a cluster
// (+cluster|slots +command) and with taskrl's key pattern for the --prefix
// they use (~PREFIX* for ~taskrl:*): every task is served once, worker
// status reads the limits, and no node's ACL LOG has an entry for them.
func TestRedisACLCluster(t *testing.T) {
	worker, enqueue := workerAndEnqueue(t)
	cc := redistest.Cluster(t)
	addrs := redistest.ClusterAddrs(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t, cc, "aclc")
	ctx := context.Background()
	var users []aclUser
	for _, u := range []aclUser{readACL(t, "worker.acl", "WORKER_PASSWORD_SHA256"), readACL(t, "enqueue.acl", "ENQUEUE_PASSWORD_SHA256")} {
		u.name += "-" + strings.ReplaceAll(prefix[len(prefix)-9:len(prefix)-1], ":", "")
		for i, r := range u.rules {
			if r == "~taskrl:*" {
				u.rules[i] = "~" + prefix + "*"
			}
		}
		u.rules = append(u.rules, "+cluster|slots", "+command")
		users = append(users, u)
	}
	// Every node has the users, and forgets them when the test ends.
	admins := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		admins[i] = redis.NewClient(&redis.Options{Addr: addr})
		admin := admins[i]
		t.Cleanup(func() {
			for _, u := range users {
				admin.ACLDelUser(context.Background(), u.name)
			}
			admin.Close()
		})
		for _, u := range users {
			args := []any{"acl", "setuser", u.name}
			for _, r := range u.rules {
				args = append(args, r)
			}
			if err := admin.Do(ctx, args...).Err(); err != nil {
				t.Fatalf("ACL SETUSER on %s: %v", addr, err)
			}
		}
	}
	url := func(u aclUser) string {
		return "redis://" + u.name + ":" + u.password + "@" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	}
	wu, eu := users[0], users[1]
	a := newAPI(t)
	policy := writePolicy(t, securityPolicy)
	const n = 12
	if code, out := runBinary(t, enqueue, "--redis-cluster", url(eu), "--url", a.URL+"/ok", "--count", fmt.Sprint(n), "--businesses", "3", "--queue", queue); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s", code, out)
	}
	w := startWorker(t, worker, "--redis-cluster", url(wu), "--prefix", prefix, "--policy", policy, "--concurrency", "4", "--queues", queue+"=1")
	servedOnce(t, a, asynq.NewInspectorFromRedisClient(cc), queue, n, w)
	if code, out := runBinary(t, worker, "status", "--redis-cluster", url(wu), "--prefix", prefix, "--policy", policy, "--key", "b1"); code != exitOK || !strings.Contains(out, "sec-rate") {
		t.Errorf("worker status: exit %d\n%s", code, out)
	}
	if code := w.stop(t, syscall.SIGTERM); code != exitOK {
		t.Errorf("worker: exit %d after SIGTERM; log:\n%s", code, w.logs)
	}
	for i, admin := range admins {
		for _, e := range aclLog(t, admin) {
			for _, u := range users {
				if strings.HasPrefix(e, "user "+u.name+":") {
					t.Errorf("node %s refused: %s", addrs[i], e)
				}
			}
		}
	}
}
