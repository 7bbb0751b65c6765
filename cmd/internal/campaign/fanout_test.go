package campaign

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// Recorder is a slog.Handler that keeps the records' messages and
// attributes, for tests.
type Recorder struct {
	mu      sync.Mutex
	records []map[string]string
	attrs   []slog.Attr
}

func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{"msg": rec.Message}
	for _, a := range r.attrs {
		m[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	r.mu.Lock()
	r.records = append(r.records, m)
	r.mu.Unlock()
	return nil
}

func (r *Recorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &recorderView{r: r, attrs: as}
}

func (r *Recorder) WithGroup(string) slog.Handler { return r }

// Outcomes returns the "outcome" attribute of every record that has one.
func (r *Recorder) Outcomes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.records {
		if o, ok := m["outcome"]; ok {
			out = append(out, o)
		}
	}
	return out
}

// Find returns the records whose outcome is o.
func (r *Recorder) Find(o string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, m := range r.records {
		if m["outcome"] == o {
			out = append(out, m)
		}
	}
	return out
}

type recorderView struct {
	r     *Recorder
	attrs []slog.Attr
}

func (v *recorderView) Enabled(context.Context, slog.Level) bool { return true }
func (v *recorderView) Handle(ctx context.Context, rec slog.Record) error {
	rec.AddAttrs(v.attrs...)
	return v.r.Handle(ctx, rec)
}
func (v *recorderView) WithAttrs(as []slog.Attr) slog.Handler {
	return &recorderView{r: v.r, attrs: append(append([]slog.Attr(nil), v.attrs...), as...)}
}
func (v *recorderView) WithGroup(string) slog.Handler { return v }

// serve runs an asynq server on queue q with handler h until the test ends,
// and reports each fan-out's result on the returned channel.
func serve(t *testing.T, rdb redis.UniversalClient, q string, h asynq.Handler) <-chan error {
	results := make(chan error, 100)
	mux := asynq.NewServeMux()
	mux.HandleFunc(TypeFanout, func(ctx context.Context, task *asynq.Task) error {
		err := h.ProcessTask(ctx, task)
		results <- err
		return err
	})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues:            map[string]int{q: 1},
		Concurrency:       4,
		TaskCheckInterval: 20 * time.Millisecond,
		ShutdownTimeout:   time.Second,
		LogLevel:          asynq.FatalLevel,
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return results
}

func waitResults(t *testing.T, ch <-chan error, n int) []error {
	t.Helper()
	var out []error
	for len(out) < n {
		select {
		case err := <-ch:
			out = append(out, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d fan-outs ran", len(out), n)
		}
	}
	return out
}

// fanoutSetup returns a campaign of n tasks into queue "tasks" that nothing
// processes, so they stay pending, and the queue its fan-out runs on. Its
// yearly schedule puts every fan-out of the test in the same tick (unless
// the test runs across New Year).
func fanoutSetup(t *testing.T, rdb redis.UniversalClient, n int) (Spec, string) {
	spec := Spec{
		Name:       "camp-" + strings.ReplaceAll(strings.TrimSuffix(redistest.Prefix(t), ":"), ":", "-"),
		URL:        "http://api.example/x",
		Count:      n,
		Businesses: 4,
		Queue:      redistest.Queue(t, rdb, "tasks"),
		Cron:       "0 0 1 1 *",
		Prefix:     redistest.Prefix(t),
	}.Normalize()
	if len(spec.Name) > 64 {
		spec.Name = spec.Name[:64]
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	return spec, redistest.Queue(t, rdb, "fanout")
}

func enqueueFanout(t *testing.T, rdb redis.UniversalClient, spec Spec, q string, id string) {
	t.Helper()
	payload, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	opts := []asynq.Option{asynq.Queue(q), asynq.MaxRetry(0)}
	if id != "" {
		opts = append(opts, asynq.TaskID(id))
	}
	if _, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask(TypeFanout, payload), opts...); err != nil {
		t.Fatal(err)
	}
}

func currentTick(t *testing.T, rdb redis.UniversalClient, spec Spec) time.Time {
	sched, err := ParseSchedule(spec.Cron, spec.TZ)
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return sched.Tick(now)
}

// checkTasks checks that the campaign's queue holds exactly its n tasks for
// tick, with their deterministic IDs and payloads.
func checkTasks(t *testing.T, rdb redis.UniversalClient, spec Spec, tick time.Time) {
	t.Helper()
	ts := redistest.Pending(t, rdb, spec.Queue)
	if len(ts) != spec.Len() {
		t.Fatalf("%d tasks pending, want %d", len(ts), spec.Len())
	}
	byID := map[string]*asynq.TaskInfo{}
	for _, ti := range ts {
		byID[ti.ID] = ti
	}
	for i := 0; i < spec.Len(); i++ {
		ti := byID[TaskID(spec.Name, tick, i)]
		if ti == nil {
			t.Fatalf("task %s missing", TaskID(spec.Name, tick, i))
		}
		if string(ti.Payload) != string(spec.Payload(i)) || ti.Type != spec.Type {
			t.Errorf("task %s: %s %s", ti.ID, ti.Type, ti.Payload)
		}
	}
}

func TestFanoutOncePerTick(t *testing.T) {
	rdb := redistest.Client(t)
	spec, fq := fanoutSetup(t, rdb, 50)
	rec := &Recorder{}
	results := serve(t, rdb, fq, NewFanoutHandler(rdb, WithLogger(slog.New(rec)), WithParallel(4)))
	// Three schedulers enqueued a fan-out for the same tick.
	for i := 0; i < 3; i++ {
		enqueueFanout(t, rdb, spec, fq, "")
	}
	for _, err := range waitResults(t, results, 3) {
		if err != nil {
			t.Errorf("fan-out: %v", err)
		}
	}
	tick := currentTick(t, rdb, spec)
	checkTasks(t, rdb, spec, tick)
	if got := len(rec.Find("fanned_out")); got != 1 {
		t.Errorf("%d fan-outs fanned out, want 1 (outcomes %v)", got, rec.Outcomes())
	}
	if got := len(rec.Find("duplicate")); got != 2 {
		t.Errorf("%d fan-outs skipped as duplicates, want 2 (outcomes %v)", got, rec.Outcomes())
	}
	// The claim holds the winner's ID and expires.
	ttl, err := rdb.TTL(context.Background(), keysFor(spec).claim(tick)).Result()
	if err != nil || ttl <= 0 {
		t.Errorf("claim TTL %s, %v", ttl, err)
	}
}

func TestFanoutResumesAfterCrash(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	spec, fq := fanoutSetup(t, rdb, 10)
	tick := currentTick(t, rdb, spec)
	k := keysFor(spec)
	// An earlier attempt of fan-out "fan-A" claimed the tick, checkpointed
	// tasks 0-1 and enqueued 2-4 before it crashed.
	rdb.Set(ctx, k.task("fan-A"), tick.Unix(), time.Hour)
	rdb.Set(ctx, k.claim(tick), "fan-A", time.Hour)
	rdb.Set(ctx, k.done(tick), 2, time.Hour)
	client := asynq.NewClientFromRedisClient(rdb)
	for i := 0; i < 5; i++ {
		task := asynq.NewTask(spec.Type, spec.Payload(i))
		if _, err := client.Enqueue(task, append(spec.Options(), asynq.TaskID(TaskID(spec.Name, tick, i)))...); err != nil {
			t.Fatal(err)
		}
	}
	rec := &Recorder{}
	h := NewFanoutHandler(rdb, WithLogger(slog.New(rec)))
	h.(*fanout).chunk = 2
	results := serve(t, rdb, fq, h)
	enqueueFanout(t, rdb, spec, fq, "fan-A")
	if err := waitResults(t, results, 1)[0]; err != nil {
		t.Fatal(err)
	}
	checkTasks(t, rdb, spec, tick)
	done := rec.Find("fanned_out")
	if len(done) != 1 || done[0]["from"] != "2" || done[0]["existing"] != "3" || done[0]["enqueued"] != "5" {
		t.Errorf("fan-out log %v, want from 2, 3 existing, 5 enqueued", done)
	}
	if len(rec.Find("resume")) != 1 {
		t.Errorf("outcomes %v, want a resume", rec.Outcomes())
	}
	if n, _ := rdb.Get(ctx, k.done(tick)).Int(); n != 10 {
		t.Errorf("checkpoint %d, want 10", n)
	}
}

func TestFanoutTickClaimedElsewhere(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	spec, fq := fanoutSetup(t, rdb, 10)
	tick := currentTick(t, rdb, spec)
	rdb.Set(ctx, keysFor(spec).claim(tick), "another-fanout", time.Hour)
	rec := &Recorder{}
	results := serve(t, rdb, fq, NewFanoutHandler(rdb, WithLogger(slog.New(rec))))
	enqueueFanout(t, rdb, spec, fq, "")
	if err := waitResults(t, results, 1)[0]; err != nil {
		t.Fatal(err)
	}
	if n := len(redistest.Pending(t, rdb, spec.Queue)); n != 0 {
		t.Errorf("%d tasks enqueued for a tick another fan-out claimed", n)
	}
	if d := rec.Find("duplicate"); len(d) != 1 || d[0]["owner"] != "another-fanout" {
		t.Errorf("log %v", d)
	}
}

func TestFanoutRecordedTick(t *testing.T) {
	// The scheduler recorded the fan-out's tick when it enqueued it; the
	// worker runs it much later, in another tick, and still fans out the
	// recorded one.
	ctx := context.Background()
	rdb := redistest.Client(t)
	spec, fq := fanoutSetup(t, rdb, 3)
	old := currentTick(t, rdb, spec).AddDate(-1, 0, 0)
	rdb.Set(ctx, keysFor(spec).task("fan-late"), old.Unix(), time.Hour)
	results := serve(t, rdb, fq, NewFanoutHandler(rdb, WithLogger(slog.New(&Recorder{}))))
	enqueueFanout(t, rdb, spec, fq, "fan-late")
	if err := waitResults(t, results, 1)[0]; err != nil {
		t.Fatal(err)
	}
	checkTasks(t, rdb, spec, old)
}

func TestFanoutBadPayloadArchived(t *testing.T) {
	rdb := redistest.Client(t)
	fq := redistest.Queue(t, rdb, "fanout")
	results := serve(t, rdb, fq, NewFanoutHandler(rdb, WithLogger(slog.New(&Recorder{}))))
	for _, payload := range []string{`{"name":"x","count":0,"url":"http://x","cron":"@daily"}`, `[]`, `{"name":"x","count":1,"url":"http://x"}`, `{"name":"x","count":1,"url":"http://x","cron":"@daily","bogus":1}`} {
		if _, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask(TypeFanout, []byte(payload)), asynq.Queue(fq)); err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range waitResults(t, results, 4) {
		if err == nil || !strings.Contains(err.Error(), "fan-out payload") {
			t.Errorf("error %v", err)
		}
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ts, _ := insp.ListArchivedTasks(fq)
		if len(ts) == 4 {
			for _, ti := range ts {
				if !strings.Contains(ti.LastErr, "campaign: fan-out payload") {
					t.Errorf("archived with %q", ti.LastErr)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 4 bad fan-outs archived", len(ts))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestFanoutTask(t *testing.T) {
	mr := 0
	spec := Spec{Name: "weekly", URL: "http://x", Count: 5, Queue: "mail", MaxRetry: &mr, Cron: "0 9 * * 1", TZ: "Europe/Paris"}
	task, opts, sched, err := FanoutTask(spec)
	if err != nil {
		t.Fatal(err)
	}
	if task.Type() != TypeFanout || sched.Period() != 167*time.Hour {
		t.Errorf("task %s, period %s", task.Type(), sched.Period())
	}
	got, _, err := decodeFanout(task.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "weekly" || got.Len() != 5 || got.Queue != "mail" || *got.MaxRetry != 0 || got.TZ != "Europe/Paris" {
		t.Errorf("decoded %+v", got)
	}
	var s []string
	for _, o := range opts {
		s = append(s, o.String())
	}
	if strings.Join(s, " ") != `Queue("mail") Unique(83h30m0s)` {
		t.Errorf("options %v", s)
	}
	if _, _, _, err := FanoutTask(Spec{URL: "http://x", Count: 1, Cron: "@daily"}); err == nil {
		t.Error("fan-out without a name accepted")
	}
}
