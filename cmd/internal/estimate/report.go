package estimate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// timeLayout formats the report's instants.
const timeLayout = "2006-01-02 15:04:05.000 MST"

// FormatDuration formats d in seconds with two decimals, followed by a
// rounded duration when it is a minute or more: "9.90s", "380.00s (6m20s)".
func FormatDuration(d time.Duration) string {
	s := fmt.Sprintf("%.2fs", d.Seconds())
	if d >= time.Minute {
		s += " (" + d.Round(time.Second).String() + ")"
	}
	return s
}

// Write prints the report as a small human-readable table.
func (r *Report) Write(w io.Writer) error {
	var b strings.Builder
	state := "limits idle"
	if len(r.Ahead) > 0 {
		state = "limits as Redis has them"
	}
	fmt.Fprintf(&b, "dry run: %d tasks of type %q on queue %q, %s at %s\n", r.Tasks, r.Type, r.Queue, state, r.Start.Format(timeLayout))
	for _, a := range r.Ahead {
		key := a.Key
		if key == "" {
			key = "(global)"
		}
		fmt.Fprintf(&b, "already ahead: rule %s key %s: %d used, %d tasks waiting\n", a.Rule, key, a.Used, a.Waiting)
	}
	if len(r.Rules) == 0 {
		fmt.Fprintf(&b, "no rule of the policy applies to these tasks: all %d run without limits\n", r.Tasks)
		_, err := io.WriteString(w, b.String())
		return err
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tLIMIT\tKEY\tKEYS\tALONE")
	for _, rr := range r.Rules {
		key := rr.Key
		if key == "" {
			key = "(global)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", rr.Name, rr.Limit, key, rr.Keys, FormatDuration(rr.Alone))
	}
	tw.Flush()
	b.WriteString("(ALONE: how long the campaign would take under that rule alone)\n\n")
	binding := r.Binding
	if binding == "" {
		binding = "none (no task waits)"
	}
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "binding rule:\t%s\n", binding)
	fmt.Fprintf(tw, "estimated duration:\t%s (until the last task starts)\n", FormatDuration(r.Duration))
	fmt.Fprintf(tw, "completes at:\t%s (the last task starts; it runs about %s)\n", r.End.Format(timeLayout), r.TaskDuration)
	fmt.Fprintf(tw, "tasks no rule matches:\t%d\n", r.Unmatched)
	if r.Refused > 0 {
		fmt.Fprintf(tw, "tasks the worker would archive:\t%d (first: task %d: %s)\n", r.Refused, r.FirstRefused+1, r.RefusedReason)
	} else {
		fmt.Fprintf(tw, "tasks the worker would archive:\t0\n")
	}
	tw.Flush()
	_, err := io.WriteString(w, b.String())
	return err
}
