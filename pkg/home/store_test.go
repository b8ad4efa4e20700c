package home

import (
	"context"
	"errors"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// vols is an in-memory Engine.
type vols struct {
	have    map[string]*podman.Volume
	err     error
	removed []string
}

func (f *vols) VolumeExists(_ context.Context, name string) (bool, error) {
	return f.have[name] != nil, f.err
}

func (f *vols) CreateVolume(context.Context, string, map[string]string) (string, error) {
	return "", errors.New("not in this test")
}

func (f *vols) InspectVolume(_ context.Context, name string) (*podman.Volume, error) {
	if f.err != nil {
		return nil, f.err
	}
	return f.have[name], nil
}

func (f *vols) RemoveVolume(_ context.Context, name string) error {
	f.removed = append(f.removed, name)
	return nil
}

func (f *vols) Info(context.Context) (*podman.HostInfo, error) {
	return &podman.HostInfo{GraphRoot: "/var/lib/containers/storage"}, f.err
}

func TestVolumesRootOfAMissingVolume(t *testing.T) {
	v := &Store{Engine: &vols{have: map[string]*podman.Volume{}}, StateDir: t.TempDir(), Prefix: "shrooms-home-"}
	root, err := v.Root(context.Background(), v.Volume(taskid.Must("t1")))
	assert.NilError(t, err)
	assert.Equal(t, root, "/var/lib/containers/storage/volumes/shrooms-home-t1/_data")
	assert.Equal(t, v.Name(taskid.Must("t1")), "shrooms-home-t1")
}

func TestVolumesRefuseAnotherTasksVolume(t *testing.T) {
	ctx := context.Background()
	e := &vols{have: map[string]*podman.Volume{"shrooms-home-t1": {Mountpoint: "/nowhere", Labels: map[string]string{sealed.LabelTask: "t2"}}}}
	v := &Store{Engine: e, StateDir: t.TempDir(), Prefix: "shrooms-home-"}
	_, err := v.Open(ctx, taskid.Must("t1"), false)
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.ErrorContains(t, err, "is not task t1's HOME")
	_, err = v.Mounted(ctx, taskid.Must("t1"))
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.Equal(t, len(e.removed), 0, "another task's volume is never removed")
}

func TestVolumesEngineFailureIsHostNotReady(t *testing.T) {
	cause := errors.New("podman API unreachable")
	v := &Store{Engine: &vols{err: cause}, StateDir: t.TempDir(), Prefix: "p-"}
	for name, f := range map[string]func() error{
		"root":   func() error { _, err := v.Root(context.Background(), v.Volume(taskid.Must("t"))); return err },
		"open":   func() error { _, err := v.Open(context.Background(), taskid.Must("t"), false); return err },
		"remove": func() error { return v.Remove(context.Background(), taskid.Must("t")) },
	} {
		err := f()
		assert.Assert(t, errors.Is(err, fault.HostNotReady), "%s: %v", name, err)
		assert.Assert(t, errors.Is(err, cause), "%s: the cause is kept: %v", name, err)
	}
}
