package config_test

import (
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

// TestBlockedRangesMatchTheSeal keeps config's copy of the blocked ranges
// equal to the seal's, so load-time and apply-time checks agree.
func TestBlockedRangesMatchTheSeal(t *testing.T) {
	v4, v6 := config.BlockedRanges()
	assert.DeepEqual(t, v4, firewall.Blocked4)
	assert.DeepEqual(t, v6, firewall.Blocked6)
}
