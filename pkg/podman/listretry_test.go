package podman

import (
	"errors"
	"testing"
)

// The exact text podman 4.3 answers a listing with while another
// container's netns is being torn down (seen on this project's test hosts).
func TestNetnsTeardownRaceIsRecognised(t *testing.T) {
	race := errors.New(`joining network namespace of container 058d7f89: retrieving network namespace at /run/netns/netns-d84dc28f: unknown FS magic on "/run/netns/netns-d84dc28f": ef53`)
	if !netnsTeardownRace(race) {
		t.Fatal("podman#16140's error not recognised: listings would fail during teardowns")
	}
	for _, other := range []string{
		"connect: no such file or directory",
		"no such container",
		`unknown FS magic on "/var/lib/x": ef53`,
	} {
		if netnsTeardownRace(errors.New(other)) {
			t.Errorf("%q retried as podman#16140, but it is another failure", other)
		}
	}
}
