"""predictor.platform's loading cache: one version of each platform directory in memory."""
import os
import shutil

import pytest

from predictor import load_platform
from predictor import platform as platform_mod
from predictor.platform import SHIPPED_DIR


def test_a_platform_edited_on_disk_replaces_its_older_version_in_the_cache(tmp_path):
    root = tmp_path / "plats"
    shutil.copytree(SHIPPED_DIR / "_bundles" / "gh200-120gb", root / "_bundles" / "gh200-120gb")
    shutil.copytree(SHIPPED_DIR / "vista-gh200", root / "vista-gh200")
    d = root / "vista-gh200"
    first = load_platform(d)
    assert load_platform(d) is first                  # unchanged on disk: the cached one
    toml = d / "platform.toml"
    for step in (1, 2):                               # a refit rewrites it: a newer mtime each time
        st = toml.stat()
        os.utime(toml, ns=(st.st_atime_ns, st.st_mtime_ns + step * 10**9))
        assert load_platform(d) is not first
    kept = [k for k in platform_mod._cache if k[0] == str(d.resolve())]
    assert len(kept) == 1
    bundle_dirs = [k[0] for k in platform_mod._bundles if k[0].startswith(str(root.resolve()))]
    assert bundle_dirs and len(bundle_dirs) == len(set(bundle_dirs))   # one version per bundle


def test_a_misspelt_platform_name_gets_a_did_you_mean():
    from predictor.errors import PlatformNotFound
    from predictor.platform import resolve_platform
    with pytest.raises(PlatformNotFound, match=r"no platform 'dgx_h100' \(did you mean 'dgx-h100'\?\) \(known: "):
        resolve_platform("dgx_h100")
