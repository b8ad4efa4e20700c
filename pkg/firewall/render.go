package firewall

import (
	"fmt"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// render is the canonical text of the seal: what the digest is taken over,
// and what Verify compares line by line with the kernel's copy. Set IDs,
// rule handles and counter values are left out; order of sets and chains is
// by name, order of rules is kept (it matters).
func render(p *plan) string {
	var b strings.Builder
	for _, ts := range p.tables {
		fmt.Fprintf(&b, "table %s %s flags=0\n", familyName(ts.family), ts.name)
		sets := append([]setSpec(nil), ts.sets...)
		sort.Slice(sets, func(i, j int) bool { return sets[i].name < sets[j].name })
		for _, s := range sets {
			renderSet(&b, s.name, s.keyType.Name, s.interval, s.tag(), s.elems)
		}
		chains := append([]chainSpec(nil), ts.chains...)
		sort.Slice(chains, func(i, j int) bool { return chains[i].name < chains[j].name })
		for _, c := range chains {
			fmt.Fprintf(&b, " chain %s type=filter hook=%d prio=%d policy=%s\n", c.name, *c.hook, chainPriority, c.policyName())
			for _, r := range c.rules {
				renderRule(&b, r)
			}
		}
	}
	return b.String()
}

func renderSet(b *strings.Builder, name, keyType string, interval bool, tag string, elems []nftables.SetElement) {
	fmt.Fprintf(b, " set %s type=%s interval=%v", name, keyType, interval)
	if tag != "" {
		// Filled from DNS or from the host's routes at apply time: checked
		// by checkResolved or checkRouted instead.
		b.WriteString(" " + tag + "\n")
		return
	}
	b.WriteString("\n")
	lines := make([]string, 0, len(elems))
	for _, e := range elems {
		lines = append(lines, fmt.Sprintf("  elem %x end=%v", e.Key, e.IntervalEnd))
	}
	sort.Strings(lines)
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
}

func renderRule(b *strings.Builder, exprs []expr.Any) {
	parts := make([]string, 0, len(exprs))
	for _, e := range exprs {
		parts = append(parts, renderExpr(e))
	}
	b.WriteString("  rule " + strings.Join(parts, "; ") + "\n")
}

func renderExpr(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Meta:
		return fmt.Sprintf("meta key=%d reg=%d set=%v", e.Key, e.Register, e.SourceRegister)
	case *expr.Cmp:
		return fmt.Sprintf("cmp op=%d reg=%d data=%x", e.Op, e.Register, e.Data)
	case *expr.Payload:
		return fmt.Sprintf("payload op=%d base=%d off=%d len=%d dreg=%d sreg=%d csum=%d/%d/%d",
			e.OperationType, e.Base, e.Offset, e.Len, e.DestRegister, e.SourceRegister, e.CsumType, e.CsumOffset, e.CsumFlags)
	case *expr.Lookup:
		return fmt.Sprintf("lookup set=%s sreg=%d inv=%v dreg=%d/%v", e.SetName, e.SourceRegister, e.Invert, e.DestRegister, e.IsDestRegSet)
	case *expr.Counter:
		return "counter"
	case *expr.Verdict:
		return fmt.Sprintf("verdict kind=%d chain=%s", e.Kind, e.Chain)
	case *expr.Ct:
		return fmt.Sprintf("ct key=%d reg=%d set=%v dir=%d", e.Key, e.Register, e.SourceRegister, e.Direction)
	case *expr.Bitwise:
		return fmt.Sprintf("bitwise sreg=%d dreg=%d len=%d mask=%x xor=%x", e.SourceRegister, e.DestRegister, e.Len, e.Mask, e.Xor)
	}
	return fmt.Sprintf("%T%+v", e, e)
}

// queue adds one table with its sets, chains and rules to c's batch.
func queue(c *nftables.Conn, ts tableSpec) error {
	t := c.AddTable(&nftables.Table{Family: ts.family, Name: ts.name})
	ids := map[string]uint32{}
	for _, s := range ts.sets {
		set := &nftables.Set{Table: t, Name: s.name, KeyType: s.keyType, Interval: s.interval}
		if err := c.AddSet(set, s.elems); err != nil {
			return fmt.Errorf("set %s: %w", s.name, err)
		}
		ids[s.name] = set.ID
	}
	for _, cs := range ts.chains {
		policy := nftables.ChainPolicyAccept
		if cs.policyName() == "drop" {
			policy = nftables.ChainPolicyDrop
		}
		ch := c.AddChain(&nftables.Chain{
			Name: cs.name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: cs.hook, Priority: nftables.ChainPriorityRef(chainPriority), Policy: &policy,
		})
		for _, r := range cs.rules {
			exprs := make([]expr.Any, len(r))
			for i, e := range r {
				if l, ok := e.(*expr.Lookup); ok {
					cp := *l
					cp.SetID = ids[l.SetName]
					e = &cp
				}
				exprs[i] = e
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
		}
	}
	return nil
}

// readTable renders the kernel's copy of table ts the way render does.
func readTable(c *nftables.Conn, ts tableSpec) (string, bool, error) {
	tables, err := c.ListTablesOfFamily(ts.family)
	if err != nil {
		return "", false, err
	}
	var t *nftables.Table
	for _, x := range tables {
		if x.Name == ts.name {
			t = x
		}
	}
	if t == nil {
		return "", false, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s flags=%d\n", familyName(ts.family), ts.name, t.Flags)
	tags := map[string]string{}
	for _, s := range ts.sets {
		tags[s.name] = s.tag()
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return "", true, err
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].Name < sets[j].Name })
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return "", true, fmt.Errorf("set %s: %w", s.Name, err)
		}
		renderSet(&b, s.Name, s.KeyType.Name, s.Interval, tags[s.Name], elems)
	}
	chains, err := c.ListChainsOfTableFamily(ts.family)
	if err != nil {
		return "", true, err
	}
	var mine []*nftables.Chain
	for _, ch := range chains {
		if ch.Table != nil && ch.Table.Name == ts.name {
			mine = append(mine, ch)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].Name < mine[j].Name })
	for _, ch := range mine {
		hook, prio, policy := -1, 0, "none"
		if ch.Hooknum != nil {
			hook = int(*ch.Hooknum)
		}
		if ch.Priority != nil {
			prio = int(*ch.Priority)
		}
		if ch.Policy != nil {
			policy = map[nftables.ChainPolicy]string{nftables.ChainPolicyAccept: "accept", nftables.ChainPolicyDrop: "drop"}[*ch.Policy]
		}
		fmt.Fprintf(&b, " chain %s type=%s hook=%d prio=%d policy=%s\n", ch.Name, ch.Type, hook, prio, policy)
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return "", true, fmt.Errorf("chain %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			renderRule(&b, r.Exprs)
		}
	}
	return b.String(), true, nil
}
