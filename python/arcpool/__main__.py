"""python3 -m arcpool: prints the version and the driver arcpool would use (device 0).

python3 -m arcpool plot INPUT -o PNG: memory over time (see arcpool.plot)."""
import sys

import arcpool


def main(argv):
    if argv[:1] == ["plot"]:
        from arcpool import plot

        return plot.main(argv[1:])
    if argv:
        print("usage: python -m arcpool [plot INPUT -o PNG [--json JSON]]", file=sys.stderr)
        return 2
    version = arcpool.VERSION
    print(f"arcpool {version // 10000}.{version // 100 % 100}.{version % 100}: "
          f"driver {arcpool.DRIVER} (device 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
