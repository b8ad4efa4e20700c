package turn

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestFlockHolder(t *testing.T) {
	locks := []byte(`1: POSIX  ADVISORY  WRITE 111 fd:01:131 0 EOF
2: FLOCK  ADVISORY  WRITE 4242 fd:01:131 0 EOF
2: -> FLOCK  ADVISORY  WRITE 5555 fd:01:131 0 EOF
3: FLOCK  ADVISORY  WRITE 777 08:10:131 0 EOF
`)
	assert.Equal(t, flockHolder(locks, 0xfd, 1, 131), 4242, "the FLOCK holder, not a POSIX lock or a waiter")
	assert.Equal(t, flockHolder(locks, 8, 16, 131), 777, "device numbers are hex")
	assert.Equal(t, flockHolder(locks, 0xfd, 1, 132), 0)
}
