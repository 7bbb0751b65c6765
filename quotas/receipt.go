package quotas

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Receipt returns what Refund needs of an admitted or booked Decision as a
// short printable string without spaces in its fields, so that another
// process can refund the charge later: a worker that books a slot for a
// rescheduled task hands the receipt on with the task, and the worker that
// runs it refunds the booking if the task does not happen (the remote side
// throttled, or it comes back too late for its slot). ParseReceipt turns it
// back into a Decision for Refund with the same Set and Request. Receipt
// returns "" for a denied Decision. Leases are not part of a receipt: release
// them with Release. The format is "r2 NOW COST NONCE" and per rule
// "t,u1,u2", with ",c" added when the rule was charged c units other than
// COST (Request.Costs). A Decision admitted from units taken ahead
// (Rule.Prefetch, wholly or for its global rules) refunds from its receipt
// only what its fixed and calendar windows counted; a GCRA or sliding
// rule's unit stays spent (t is -1).
func (d Decision) Receipt() string {
	if !d.Allowed {
		return ""
	}
	var b strings.Builder
	b.WriteString("r2 ")
	b.WriteString(strconv.FormatInt(d.decided(), 10))
	b.WriteByte(' ')
	b.WriteString(strconv.Itoa(d.cost))
	b.WriteByte(' ')
	if d.nonce == "" {
		b.WriteByte('-')
	} else {
		b.WriteString(d.nonce)
	}
	ats, undo := d.charges()
	for i, at := range ats {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(at, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(undo[i][0], 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(undo[i][1], 10))
		if d.costs != nil && d.costs[i] != d.cost {
			// A rule charged other than the request's cost
			// (Request.Costs): its cost, as a fourth field.
			b.WriteByte(',')
			b.WriteString(strconv.Itoa(d.costs[i]))
		}
	}
	return b.String()
}

// charges returns, per rule, the time d charged it at and its undo values,
// as a refund from a Receipt needs them. A Decision admitted from units
// taken ahead (Rule.Prefetch) gives its batch's time for a fixed or
// calendar window, where a refund un-counts the unit in the batch's
// window, and -1 for the other rules: a refund gives nothing of theirs
// back (the unit stays spent; a GCRA rule's schedule and a sliding log
// keep it until it passes).
func (d Decision) charges() ([]int64, [][2]int64) {
	b := d.pf
	if b == nil {
		return d.ats, d.undo
	}
	ats, undo := make([]int64, len(b.s.comp)), make([][2]int64, len(b.s.comp))
	for i, c := range b.s.comp {
		ats[i] = -1
		if (c.kind == kindFixed || c.kind == kindCalendar) && i < len(b.bd.ats) {
			ats[i] = b.bd.ats[i]
		}
	}
	return ats, undo
}

// ParseReceipt returns the Decision a Receipt was made from, as far as
// Refund and Held need it: Allowed is true, Now and the charges are those
// of the original; the other exported fields are zero. Refund then fails
// if the receipt is not for the Set it is given (a different number of
// rules). Receipts of earlier versions ("r1", without Now) are accepted.
func ParseReceipt(s string) (Decision, error) {
	f := strings.Split(s, " ")
	var now int64
	if len(f) > 0 && f[0] == "r2" {
		var err error
		if len(f) < 2 {
			return Decision{}, errors.New("quotas: not a receipt")
		}
		if now, err = strconv.ParseInt(f[1], 10, 64); err != nil || now < 0 {
			return Decision{}, errors.New("quotas: receipt: bad time")
		}
		f = append([]string{"r1"}, f[2:]...)
	}
	if len(f) < 3 || f[0] != "r1" {
		return Decision{}, errors.New("quotas: not a receipt")
	}
	cost, err := strconv.Atoi(f[1])
	if err != nil || cost < 1 {
		return Decision{}, errors.New("quotas: receipt: bad cost")
	}
	d := Decision{Allowed: true, cost: cost, nonce: f[2]}
	if now > 0 {
		d.Now = time.UnixMicro(now)
	}
	if d.nonce == "-" {
		d.nonce = ""
	}
	for _, rule := range f[3:] {
		var v [4]int64
		parts := strings.Split(rule, ",")
		if len(parts) != 3 && len(parts) != 4 {
			return Decision{}, errors.New("quotas: receipt: bad rule charge")
		}
		for i, p := range parts {
			if v[i], err = strconv.ParseInt(p, 10, 64); err != nil {
				return Decision{}, errors.New("quotas: receipt: bad rule charge")
			}
		}
		if len(parts) == 4 {
			if v[3] < 1 || v[3] > 1<<31-1 {
				return Decision{}, errors.New("quotas: receipt: bad rule cost")
			}
			if d.costs == nil {
				d.costs = make([]int, len(d.ats), len(f)-3)
				for i := range d.costs {
					d.costs[i] = cost
				}
			}
		}
		if d.costs != nil {
			c := cost
			if len(parts) == 4 {
				c = int(v[3])
			}
			d.costs = append(d.costs, c)
		}
		d.ats = append(d.ats, v[0])
		d.undo = append(d.undo, [2]int64{v[1], v[2]})
	}
	return d, nil
}
